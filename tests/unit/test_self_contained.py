"""The repository explains itself: no file in the code, tests, migrations, deployment files or
DEVELOPERS.md cites a document that is not in the repository (a specification named SPEC, by
section or file name, or a path into a directory beside the checkout). A reader who has only
this repository must find each rule stated where it applies.

The rule is a function of a directory tree, so the tests below also plant a citation in a copy
and check that it is found (a guard that cannot fail guards nothing)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the user's documentation (README.md, the docs/ site) included
CHECKED = ("services", "tests", "migrations", "k8s", "deploy", "bench", "examples",
           "DEVELOPERS.md", "Makefile", "pyproject.toml", "docker-compose.yml",
           "README.md", "docs", "mkdocs.yml")  # fmt: skip
SKIPPED_PARTS = frozenset({"__pycache__", ".venv", ".git", ".mypy_cache", ".ruff_cache"})
TEXT_SUFFIXES = frozenset(
    {".py", ".pyi", ".md", ".txt", ".yaml", ".yml", ".json", ".toml", ".ini", ".cfg", ".sql",
     ".sh", ".html", ".css", ".js", ".conf", ".env", ""}
)  # fmt: skip
# Written so that this file does not match itself.
OUTSIDE = re.compile(r"\bSPEC\s*§|\bSPEC\.md\b|\.\./shared\b")


def _files(root: Path, names: tuple[str, ...]) -> Iterator[Path]:
    for name in names:
        top = root / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            rel = path.relative_to(root)
            if (
                path.is_file()
                and path.suffix in TEXT_SUFFIXES
                and not SKIPPED_PARTS & set(rel.parts)
            ):
                yield path


def outside_citations(root: Path, names: tuple[str, ...] = CHECKED) -> list[str]:
    """``file:line text`` for every line under ``root``'s ``names`` citing an outside document."""
    out = []
    for path in _files(root, names):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = OUTSIDE.search(line)
            if match:
                out.append(f"{path.relative_to(root)}:{n} {match.group(0)!r}")
    return out


def test_nothing_cites_a_document_outside_the_repository() -> None:
    assert outside_citations(ROOT) == []


# ---------------------------------------------------------------- the guard can fail


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "services" / "conveyor").mkdir(parents=True)
    (tmp_path / "services" / "conveyor" / "api.py").write_text(
        '"""The API answers 413 above 1 MiB."""\nSUSPECT = 1  # SPECIAL cases: none\n'
    )
    (tmp_path / "DEVELOPERS.md").write_text("# Developers\n\nSee README.md, section Security.\n")
    (tmp_path / "README.md").write_text("# Conveyor\n\nSee [security](docs/security.md).\n")
    return tmp_path


def test_a_clean_tree_passes(tree: Path) -> None:
    assert outside_citations(tree) == []


@pytest.mark.parametrize(
    ("where", "planted"),
    [
        ("services/conveyor/api.py", '"""Limits (SPEC' + ' §6.3)."""\n'),
        ("services/conveyor/api.py", "# SPEC" + "§2: a 503 within 2 s\n"),
        ("DEVELOPERS.md", "The rules are in SPEC" + ".md.\n"),
        ("k8s/base/config.yaml", "# settings: see SPEC" + " §1\n"),
        ("tests/test_x.py", "# recipe in .." + "/shared/RECIPES.md\n"),
        ("README.md", "Priorities hold (SPEC" + " §6.6).\n"),
        ("docs/scaling.md", "Two bands per type, as SPEC" + " §6.6 asks.\n"),
    ],
)
def test_a_citation_is_found(tree: Path, where: str, planted: str) -> None:
    path = tree / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(planted)
    found = outside_citations(tree)
    assert len(found) == 1 and found[0].startswith(f"{where}:1 "), found
