"""Rough edges a new user meets in the first minutes: ``conveyor --version``; a command group
alone (``conveyor jobs``) lists what it holds; a status filter in any case, in the CLI, the API
and the dashboard; the dashboard's errors are pages, not JSON."""

from __future__ import annotations

import asyncio
import logging
from importlib.metadata import version
from typing import Any

import asyncpg
import pytest

from conveyor import JobSpec, Workflow, cli, enqueue_many, enqueue_workflow
from conveyor.core.config import Settings

from ..faults.harness import component_env
from ..stack import running_stack

LISTING_GROUPS = ("jobs", "types", "dlq", "workflows", "schedules", "keys")


@pytest.fixture
def run(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Any:
    for name, value in component_env(settings).items():
        if name.startswith("CONVEYOR_"):
            monkeypatch.setenv(name, value)

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", root.handlers[:])  # cli.main sets its own: undone after

    async def go(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = await asyncio.to_thread(cli.main, list(argv))
        except SystemExit as exc:  # argparse: --version, --help, a usage error
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return go


async def _jobs_and_a_workflow(db: asyncpg.Connection) -> None:
    await enqueue_many(db, [JobSpec("a", {"i": i}) for i in range(3)])
    wf = Workflow("rough")
    wf.add("first", "a")
    await enqueue_workflow(db, wf)


async def test_version(run: Any) -> None:
    code, out, err = await run("--version")
    assert (code, out.strip(), err) == (0, f"conveyor {version('conveyor')}", "")


async def test_a_group_alone_lists(run: Any, db: asyncpg.Connection) -> None:
    await _jobs_and_a_workflow(db)
    for group in LISTING_GROUPS:
        alone, listed = await run(group), await run(group, "list")
        assert alone[0] == 0, (group, alone)
        assert alone == listed, group
    assert len((await run("jobs"))[1].splitlines()) == 4  # three jobs and the workflow's


async def test_statuses_in_any_case(run: Any, settings: Settings, db: asyncpg.Connection) -> None:
    await _jobs_and_a_workflow(db)
    upper = await run("jobs", "list", "--status", "PENDING", "--json")
    assert upper[0] == 0 and len(upper[1].splitlines()) == 4
    for spelled in ("pending", "Pending"):
        assert await run("jobs", "list", "--status", spelled, "--json") == upper
    flows = await run("workflows", "list", "--status", "RUNNING", "--json")
    assert flows[0] == 0 and len(flows[1].splitlines()) == 1
    assert await run("workflows", "list", "--status", "running", "--json") == flows

    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        c = stack.client
        jobs = (await c.get("/jobs", params={"status": "PENDING"})).json()["jobs"]
        assert len(jobs) == 4
        for spelled in ("pending", "Pending"):
            r = await c.get("/jobs", params={"status": spelled})
            assert r.status_code == 200 and r.json()["jobs"] == jobs, r.text
        r = await c.get("/workflows", params={"status": "running"})
        assert r.status_code == 200 and len(r.json()["workflows"]) == 1, r.text
        assert (await c.get("/jobs", params={"status": "nonsense"})).status_code == 422
        page = await c.get("/ui/jobs", params={"status": "pending"})
        assert page.status_code == 200 and page.text.count("/ui/jobs/") >= 4, page.text[-1500:]


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/ui/nothere", 404, "/ui/nothere"),
        ("/ui/jobs/not-a-uuid", 404, "not-a-uuid"),
        ("/ui/workflows/not-a-uuid", 404, "not-a-uuid"),
    ],
)
async def test_dashboard_errors_are_pages(
    settings: Settings, path: str, status: int, says: str
) -> None:
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        r = await stack.client.get(path)
        assert r.status_code == status, r.text
        assert r.headers["content-type"].startswith("text/html"), (r.headers, r.text)
        assert "<nav" in r.text and says in r.text, r.text  # in the dashboard's frame
        api = await stack.client.get("/nothere")  # the API's own paths still answer JSON
        assert api.status_code == 404 and api.json()["error"] == "not_found"
