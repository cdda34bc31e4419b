"""Small things a new user meets first: the example app reaches the dead-letter
page on purpose, the docs and the CLI agree on how fast a revocation lands, the README speaks
of API keys as they are, the dashboard's times carry their zone and ``/favicon.ico`` exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from conveyor.cli.main import build_parser
from conveyor.core.config import Settings
from examples.app import router as example_router

from ..security import required
from ..stack import running_stack, wait_for

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# the README and the documentation site's pages (docs/), where the reference lives
DOCS = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


async def test_the_example_app_has_a_job_that_always_fails(settings: Settings, db_url: str) -> None:
    """`make dev`'s app fills the dead-letter page by asking, not by luck."""
    async with running_stack(settings, example_router) as stack:
        job = await stack.submit("never_succeeds", {"order": 42})
        done = await wait_for(db_url, [job], statuses={"FAILED"}, timeout=30)
        assert list(done.values()) == ["FAILED"]
        page = await stack.client.get("/ui/dead")
        assert page.status_code == 200 and "never_succeeds" in page.text, page.text[-2000:]
    assert "never_succeeds" in README  # the README says how to reach the page


def _subcommand_help(*names: str) -> str:
    parser = build_parser()
    for name in names:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser.format_help()


def test_revocation_delay_is_the_same_in_cli_readme_and_settings() -> None:
    cached = Settings.model_fields["auth_cache_seconds"].default
    help_text = _subcommand_help("keys") + _subcommand_help("keys", "revoke")
    said = re.findall(r"within (\d+(?:\.\d+)?) ?s\b", help_text)
    assert said and {float(s) for s in said} == {cached}, help_text
    docs = re.findall(r"revoke .*?within (\d+(?:\.\d+)?) s", DOCS)
    assert docs and {float(s) for s in docs} == {cached}, docs


def test_the_readme_speaks_of_api_keys_as_they_are() -> None:
    """API keys and scopes exist: no "once API keys land" (it read as a plan)."""
    assert "once API keys land" not in DOCS


async def test_dashboard_times_carry_their_zone(settings: Settings) -> None:
    open_types = settings.model_copy(update={"accept_unknown_types": True})
    async with running_stack(open_types, None, maintenance=False, relays=0) as stack:
        job = await stack.submit("x")
        for path in (f"/ui/jobs/{job}", "/ui/jobs"):
            text = (await stack.client.get(path)).text
            times = re.findall(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[^<]{0,10}", text)
            assert times, path
            assert all(t.endswith(" UTC") or "+00:00" in t for t in times), (path, times)
        # the filter's datetime-local input is read as UTC: its label says so
        assert "created since (UTC)" in (await stack.client.get("/ui/jobs")).text


async def test_favicon_is_served_without_a_key(settings: Settings) -> None:
    async with running_stack(required(settings), None, maintenance=False, relays=0) as stack:
        r = await stack.client.get("/favicon.ico")
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "image/png"
        assert r.content.startswith(b"\x89PNG\r\n\x1a\n")
        page = await stack.client.get("/ui/login")
        assert 'rel="icon"' in page.text
