"""The Python examples in the docs compile, and the client snippets (those that open a
``Client``) define every name they use: pasted alone, they run. The examples of the workflow and
admission pages use the job types of the app `make dev` serves."""

from __future__ import annotations

import ast
import builtins
import re

import pytest

from .checks import ROOT

PAGES = ["client.md", "workflows.md"]
COMPILED = [*PAGES, "admission.md"]  # pages with Python examples (the client's: in PAGES)


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


@pytest.mark.parametrize("page", COMPILED)
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


def tried_first(page: str) -> str:
    """What a reader tries against `make dev` before writing handlers of their own: the page up
    to its recipes."""
    text = (ROOT / "docs" / page).read_text()
    return text.split("## Recipes", 1)[0]


def job_types(text: str) -> set[str]:
    """Job types a snippet submits: ``wf.add(key, "type"``, ``workflow_job(key, "type"``,
    ``"type": "..."`` in a JSON body, the first element of a ``("type", {...})`` step."""
    found = re.findall(r"(?:\.add|workflow_job)\([^,]+,\s*\"([a-z_]+)\"", text)
    found += re.findall(r"\"type\":\s*\"([a-z_]+)\"", text)
    found += re.findall(r"\(\"([a-z_]+)\",\s*\{", text)
    return set(found)


def test_the_workflow_examples_use_the_make_dev_apps_types() -> None:
    """Pasted into a `make dev` session, the workflow examples run: every job type they submit
    has a handler on the app it serves (``examples/app.py``)."""
    from examples.app import router

    used = job_types(tried_first("workflows.md"))
    assert used, "no job type found in the examples"
    assert used - set(router.types) == set()


def admission_types(text: str) -> set[str]:
    """Job types the admission page's examples use: in JSON bodies, in ``/types/<type>/``
    paths, in ``conveyor types partition[s] <type>`` and in its SQL (``job_type = '<type>'``,
    ``admit('<type>'``)."""
    found = job_types(text)
    found |= set(re.findall(r"/types/([a-z_]+)/", text))
    found |= set(re.findall(r"conveyor types partitions? ([a-z_]+)", text))
    found |= set(re.findall(r"job_type = '([a-z_]+)'", text))
    found |= set(re.findall(r"admit\('([a-z_]+)'", text))
    return found


def test_the_admission_examples_use_the_make_dev_apps_types() -> None:
    """Pasted into a `make dev` session, the admission page's commands, requests and SQL name
    a type the app serves, and the partitioned handler it shows is the app's own."""
    from examples.app import router

    text = (ROOT / "docs" / "admission.md").read_text()
    used = admission_types(text)
    assert "sync_account" in used
    assert used - set(router.types) == set()
    app = (ROOT / "examples" / "app.py").read_text()
    shown = re.findall(r"^@router\.job\(.*\)$", text, flags=re.M)
    assert shown and all(line in app for line in shown), shown
    spec = router.handlers["sync_account"]
    assert spec.partition is not None and spec.partition.by == ("account",)
