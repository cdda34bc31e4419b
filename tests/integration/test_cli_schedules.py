"""``conveyor schedules list|add|pause|resume|delete`` against a real database."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from conveyor import cli
from conveyor.core.config import Settings

from ..faults.harness import component_env


async def test_schedules_cli(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in component_env(settings).items():
        if name.startswith("CONVEYOR_"):
            monkeypatch.setenv(name, value)

    async def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(cli.main, ["schedules", *argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = await run("add", "nightly", "--type", "t", "--cron", "30 2 * * *",
                             "--timezone", "Europe/Berlin", "--payload", '{"a": 1}')  # fmt: skip
    assert code == 0 and out.startswith("created nightly")
    code, out, _ = await run("add", "poll", "--type", "t", "--every", "60", "--paused")
    assert code == 0 and "paused" in out
    code, out, _ = await run("list", "--json")
    listed = {s["name"]: s for s in map(orjson.loads, out.splitlines())}  # JSON Lines
    assert listed["nightly"]["payload"] == {"a": 1} and listed["nightly"]["enabled"] is True
    assert listed["poll"]["next_run_at"] is None
    assert {s["source"] for s in listed.values()} == {"cli"}
    assert (await run("resume", "poll"))[0] == 0
    code, out, _ = await run("list")
    assert "poll" in out and "paused" not in out
    assert (await run("pause", "nightly"))[0] == 0
    assert (await run("delete", "poll"))[0] == 0
    code, out, _ = await run("list")
    assert "poll" not in out and "nightly" in out and "paused" in out
    code, _, err = await run("add", "bad", "--type", "t", "--cron", "61 * * * *")
    assert code == 2 and "Bad minute" in err
    code, _, err = await run(
        "add", "bad", "--type", "t", "--cron", "* * * * *", "--timezone", "X/Y"
    )
    assert code == 2 and "time zone" in err
    code, _, err = await run("delete", "nope")
    assert code == 1 and "no schedule nope" in err
