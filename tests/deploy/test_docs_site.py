"""The documentation: the README stays a five-minute read and DEVELOPERS.md a guide, not a
history (at most 300 lines each), the MkDocs site builds with ``--strict`` (a broken link, a
missing anchor or a page left out of the nav fails it), and every relative link in the README and
in docs/ names a file (and heading) that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .checks import ROOT

README_MAX_LINES = 300
DEVELOPERS_MAX_LINES = 300
# [text](target) and ![alt](target); the target up to a space or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _slug(heading: str) -> str:
    """A heading's anchor as MkDocs (toc) and GitHub write it, for the headings used here."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[ ]+", "-", text).strip("-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_the_readme_is_at_most_300_lines() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference to docs/"


def test_the_developers_guide_is_at_most_300_lines() -> None:
    lines = len((ROOT / "DEVELOPERS.md").read_text().splitlines())
    assert lines <= DEVELOPERS_MAX_LINES, (
        f"DEVELOPERS.md has {lines} lines; link to module docstrings and docs/ instead"
    )


def _broken_links(pages: list[Path], root: Path) -> tuple[int, list[str]]:
    broken, checked = [], 0
    for page in pages:
        for target in _links(page):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(root)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return checked, broken


def test_every_relative_link_resolves() -> None:
    checked, broken = _broken_links(_pages(), ROOT)
    assert checked > 20, f"only {checked} relative links found: the pattern is stale"
    assert not broken, broken


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A part\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# A title\n\n[ok](#a-title) [ok](other.md#a-part) [gone](nowhere.md)\n"
        "[no heading](other.md#nothing) [web](https://example.org/x)\n"
        "```\n[in a code block](ignored.md)\n```\n"
    )
    checked, broken = _broken_links([page], tmp_path)
    assert checked == 4
    assert broken == [
        "page.md: nowhere.md (no such file)",
        "page.md: other.md#nothing (no such heading)",
    ]


def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "WARNING" not in run.stderr, run.stderr
    built = {p.relative_to(site).parts[0] for p in site.glob("*/index.html")}
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"}
    assert pages <= built, pages - built
    assert (site / "index.html").exists()
    # it loads nothing from the internet (Material's default: Google Fonts on every page)
    loads = re.compile(r"<(?:link|script)\b[^>]*\b(?:href|src)=[\"']?((?:https?:)?//[^\"' >]+)")
    remote = {u for p in site.rglob("*.html") for u in loads.findall(p.read_text())}
    remote |= {
        u
        for p in site.rglob("*.css")
        for u in re.findall(r"url\(['\"]?(https?://[^)'\"]+)", p.read_text())
    }
    assert remote == set(), sorted(remote)[:10]


UI_PATH = re.compile(r"(?<![\w.])/ui(?:/[a-z][a-z-]*)*(?![\w-])")


def test_every_dashboard_path_named_in_the_docs_and_deploy_files_exists() -> None:
    """A runbook line, an alert or a Grafana panel that names a dashboard page names a real one."""
    from starlette.routing import Route

    from conveyor.api.app import create_app
    from conveyor.core.config import Settings

    app = create_app(Settings(auth="required"))
    routes = {r.path for r in app.routes if isinstance(r, Route)}
    deploy = [*(ROOT / "deploy").rglob("*.y*ml"), *(ROOT / "deploy").rglob("*.json")]
    files = [*_pages(), *sorted(deploy), *sorted((ROOT / "k8s").rglob("*.yaml"))]
    named = {
        (p.relative_to(ROOT).as_posix(), m) for p in files for m in UI_PATH.findall(p.read_text())
    }
    assert len(named) > 3, named
    missing = sorted((f, m) for f, m in named if m not in routes)
    assert not missing, missing


def test_the_runbook_covers_every_alert() -> None:
    rules = (ROOT / "deploy/prometheus/alerts.yml").read_text()
    alerts = re.findall(r"^\s*- alert: (\w+)", rules, re.M)
    runbook = (ROOT / "docs/operations.md").read_text()
    runbook = runbook[runbook.index("## When an alert fires") :]
    assert len(alerts) > 10, alerts
    assert [a for a in alerts if f"`{a}`" not in runbook] == []


def test_every_docs_page_named_in_the_repository_exists() -> None:
    """Code comments, deployment files and DEVELOPERS.md send readers to docs/<page>.md."""
    named = re.compile(r"\bdocs/([a-z][a-z-]*)\.md\b")
    tops = ["services", "tests", "migrations", "deploy", "k8s", "bench", "examples", ".ci"]
    files = [p for top in tops for p in (ROOT / top).rglob("*") if p.is_file()]
    files += [ROOT / "DEVELOPERS.md", ROOT / "README.md", ROOT / "Makefile", ROOT / "mkdocs.yml"]
    seen: dict[str, str] = {}
    for path in files:
        if ".venv" in path.parts or "__pycache__" in path.parts or path.suffix in {".png", ".pyc"}:
            continue
        for page in named.findall(path.read_text(errors="replace")):
            seen.setdefault(page, path.relative_to(ROOT).as_posix())
    assert len(seen) > 5, seen
    missing = {p: where for p, where in seen.items() if not (ROOT / "docs" / f"{p}.md").exists()}
    assert not missing, missing


def test_every_setting_is_in_the_configuration_table() -> None:
    """Each ``CONVEYOR_*`` setting has a row in docs/configuration.md; a row may name several
    that share a prefix (`` `CONVEYOR_DB_KEEPALIVES_IDLE` / `_INTERVAL` / `_COUNT` ``)."""
    from conveyor.core.config import Settings

    documented: set[str] = set()
    text = (ROOT / "docs" / "configuration.md").read_text()
    for first, rest in re.findall(r"`CONVEYOR_([A-Z_]+)`((?: / `_?[A-Z_]+`)*)", text):
        documented.add(first)
        for part in re.findall(r"`(_?[A-Z_]+)`", rest):
            full = part.startswith("CONVEYOR_")
            documented.add(
                part.removeprefix("CONVEYOR_") if full else first.rsplit("_", 1)[0] + part
            )
    missing = sorted(
        f"CONVEYOR_{n.upper()}" for n in Settings.model_fields if n.upper() not in documented
    )
    assert not missing, f"not in docs/configuration.md: {missing}"
