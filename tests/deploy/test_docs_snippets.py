"""The Python examples in the docs compile, and the client snippets (those that open a
``Client``) define every name they use: pasted alone, they run."""

from __future__ import annotations

import ast
import builtins
import re

import pytest

from .checks import ROOT

PAGES = ["client.md", "workflows.md"]


def python_blocks(page: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def undefined_names(tree: ast.AST) -> set[str]:
    defined = set(dir(builtins))
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, ast.alias):
            defined.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
            defined.update(a.arg for a in node.args.args)
    return used - defined


@pytest.mark.parametrize("page", PAGES)
def test_every_python_example_compiles(page: str) -> None:
    blocks = python_blocks(page)
    assert blocks
    for block in blocks:
        compile(block, page, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize("page", PAGES)
def test_client_snippets_define_every_name_they_use(page: str) -> None:
    snippets = [b for b in python_blocks(page) if "Client(" in b]
    assert snippets
    for block in snippets:
        tree = ast.parse(block)
        assert undefined_names(tree) == set(), block
