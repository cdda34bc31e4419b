"""``conveyor schedules list|add|pause|resume|delete`` against a real database."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from asyncio.subprocess import DEVNULL, PIPE
from pathlib import Path

import httpx
import orjson
import pytest

from conveyor import cli
from conveyor.core.config import Settings

from .. import db as tdb
from ..faults.harness import component_env
from ..stack import free_port


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


async def test_schedules_add_refuses_a_type_no_worker_registered(settings: Settings) -> None:
    """``conveyor schedules add`` of a type no worker registered is refused like ``POST
    /schedules`` (422 unknown_job_type): one line, exit 2, no schedule written. (It was
    accepted, and every tick then enqueued a job no worker would ever run; so was a payload
    that is not a JSON object.) The real command in its own process;
    ``CONVEYOR_ACCEPT_UNKNOWN_TYPES=true`` accepts the type, as the API does."""
    script = Path(sys.executable).parent / "conveyor"

    async def run(*argv: str, **extra: str) -> tuple[int, str, str]:
        p = await asyncio.create_subprocess_exec(
            script, "schedules", *argv, env=component_env(settings, **extra), stdout=PIPE,
            stderr=PIPE,
        )  # fmt: skip
        out, err = await p.communicate()
        assert p.returncode is not None
        return p.returncode, out.decode(), err.decode()

    conn = await tdb.connect(settings.database_url)
    try:
        await conn.execute("INSERT INTO job_types (name) VALUES ('known_one')")
        code, out, err = await run("add", "typo", "--type", "knwon_one", "--every", "10")
        assert code == 2 and out == "", (code, out, err)
        assert err.count("\n") == 1 and "unknown job type 'knwon_one'" in err, err
        assert "known_one" in err  # names what it would accept
        assert await conn.fetchval("SELECT count(*) FROM schedules") == 0
        # a payload that is JSON but no object ("--payload '[1]'") is refused as POST refuses it
        code, _, err = await run("add", "arr", "--type", "known_one", "--every", "10",
                                 "--payload", "[1]")  # fmt: skip
        assert code == 2 and "payload must be a JSON object" in err, (code, err)
        assert await conn.fetchval("SELECT count(*) FROM schedules") == 0
        assert (await run("add", "ok", "--type", "known_one", "--every", "10"))[0] == 0
        code, _, err = await run(
            "add", "free", "--type", "anything", "--every", "10",
            CONVEYOR_ACCEPT_UNKNOWN_TYPES="true",
        )  # fmt: skip
        assert code == 0, err
        names = await conn.fetch("SELECT name FROM schedules ORDER BY name")
        assert [r["name"] for r in names] == ["free", "ok"]
    finally:
        await conn.close()


def _faketime() -> Path:
    """Debian's libfaketime (``make system-packages`` installs it): a missing one fails the test."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    assert found, "needs libfaketime: run make system-packages (apt-get install faketime)"
    return found[0]


async def test_a_host_clock_ten_minutes_ahead_does_not_plan_the_first_tick(
    settings: Settings,
) -> None:
    """``conveyor schedules add`` and ``resume`` from a host whose clock runs 10 minutes ahead
    (libfaketime on the real process): the first tick of an every-60-s schedule is planned
    from the database's clock, so it falls within a minute of the database's now at the write
    (the row's ``updated_at``). (It was planned from the host's: 10 minutes later.)"""
    env = component_env(settings, LD_PRELOAD=str(_faketime()), FAKETIME="+10m",
                        FAKETIME_DONT_FAKE_MONOTONIC="1")  # fmt: skip
    script = Path(sys.executable).parent / "conveyor"

    async def run(*argv: str) -> None:
        p = await asyncio.create_subprocess_exec(
            script, "schedules", *argv, env=env, stdout=PIPE, stderr=PIPE
        )
        out, err = await p.communicate()
        assert p.returncode == 0, (out, err)

    conn = await tdb.connect(settings.database_url)
    try:
        await run("add", "skewed", "--type", "t", "--every", "60")
        await run("add", "resumed", "--type", "t", "--every", "60", "--paused")
        await run("resume", "resumed")
        ahead = await conn.fetch(
            "SELECT name, extract(epoch FROM next_run_at - updated_at)::float8 AS s FROM schedules"
        )
        assert {r["name"]: 0 < r["s"] <= 61 for r in ahead} == {"skewed": True, "resumed": True}
    finally:
        await conn.close()


async def test_an_api_process_ten_minutes_ahead_plans_from_the_database_clock(
    settings: Settings,
) -> None:
    """The same through ``conveyor api`` running 10 minutes ahead: ``PUT``-style create and
    ``resume`` over real HTTP plan the first tick from the database's clock."""
    port = free_port()
    env = component_env(settings, LD_PRELOAD=str(_faketime()), FAKETIME="+10m",
                        FAKETIME_DONT_FAKE_MONOTONIC="1")  # fmt: skip
    api = await asyncio.create_subprocess_exec(
        Path(sys.executable).parent / "conveyor", "api", "--port", str(port), env=env,
        stdout=DEVNULL, stderr=DEVNULL,
    )  # fmt: skip
    conn = await tdb.connect(settings.database_url)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            async with asyncio.timeout(30):
                while True:
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get("/readyz")).status_code == 200:
                            break
                    await asyncio.sleep(0.1)
            for name, enabled in (("api_skewed", True), ("api_resumed", False)):
                body = {"name": name, "type": "echo", "every_seconds": 60, "enabled": enabled}
                r = await client.post("/schedules", json=body)
                assert r.status_code == 201, r.text
            assert (await client.post("/schedules/api_resumed/resume")).status_code == 200
        ahead = await conn.fetch(
            "SELECT name, extract(epoch FROM next_run_at - updated_at)::float8 AS s FROM schedules"
        )
        assert {r["name"]: 0 < r["s"] <= 61 for r in ahead} == {
            "api_skewed": True,
            "api_resumed": True,
        }
    finally:
        await conn.close()
        api.terminate()
        await api.wait()
