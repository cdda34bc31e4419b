"""``conveyor workflows list|show|cancel`` against a real database: text and JSON Lines (the
API's resources), keyset pages, exit codes (1: no such workflow, 2: a bad id or cursor)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import orjson
import pytest

from conveyor import cli
from conveyor.core.config import Settings
from conveyor.workflows import Workflow, enqueue_workflow

from ..faults.harness import component_env


async def test_workflows_cli(
    settings: Settings,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in component_env(settings).items():
        if name.startswith("CONVEYOR_"):
            monkeypatch.setenv(name, value)

    async def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(cli.main, ["workflows", *argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    ids = []
    for i in range(3):
        wf = Workflow(f"nightly-{i}")
        wf.add("fetch", "t", {"i": i})
        wf.add("report", "t", after=["fetch"])
        ids.append(await enqueue_workflow(db, wf))

    code, out, _ = await run("list", "--json")
    listed = [orjson.loads(line) for line in out.splitlines()]  # JSON Lines, newest first
    assert code == 0 and [w["id"] for w in listed] == [str(i) for i in reversed(ids)]
    assert listed[0]["counts"] == {"jobs": 2, "waiting": 1, "queued": 1, "running": 0,
                                   "completed": 0, "failed": 0, "cancelled": 0}  # fmt: skip
    code, out, err = await run("list", "--limit", "2")
    assert code == 0 and len(out.splitlines()) == 2 and "nightly-2" in out
    cursor = err.split("--cursor ")[1].strip()
    code, out, _ = await run("list", "--limit", "2", "--cursor", cursor)
    assert code == 0 and str(ids[0]) in out and len(out.splitlines()) == 1
    code, out, _ = await run("list", "--limit", "1", "--all")
    assert code == 0 and len(out.splitlines()) == 3

    code, out, _ = await run("show", str(ids[1]))
    assert code == 0 and "nightly-1" in out and "RUNNING" in out
    report = next(line for line in out.splitlines() if line.startswith("report"))
    assert "WAITING" in report and report.endswith("fetch")
    code, out, _ = await run("show", str(ids[1]), "--json")
    shown = orjson.loads(out)
    jobs = {j["key"]: j for j in shown["jobs"]}
    assert jobs["report"]["depends_on"] == [jobs["fetch"]["id"]]

    code, out, err = await run("cancel", str(ids[1]))
    assert code == 0 and "cancelled 2 jobs" in err and "CANCELLED" in out
    code, out, _ = await run("cancel", str(ids[1]), "--json")  # idempotent
    assert code == 0 and orjson.loads(out)["status"] == "CANCELLED"
    code, out, _ = await run("list", "--status", "CANCELLED", "--json")
    assert [orjson.loads(line)["id"] for line in out.splitlines()] == [str(ids[1])]
    code, out, _ = await run("list", "--name", "nightly-0", "--json")
    assert [orjson.loads(line)["id"] for line in out.splitlines()] == [str(ids[0])]

    missing = uuid.uuid4()
    for action in ("show", "cancel"):
        code, _, err = await run(action, str(missing))
        assert code == 1 and f"no workflow {missing}" in err
    code, _, err = await run("show", "not-an-id")
    assert code == 2 and "not a workflow id" in err
    code, _, err = await run("list", "--cursor", "%%%")
    assert code == 2 and "cursor" in err
