"""``conveyor types partitions`` and ``conveyor types partition`` as an operator meets them: a
table of a type's keys (``--json``: what ``GET /types/{type}/partitions`` answers, JSON Lines;
pages with ``--limit``, ``--cursor``, ``--all``), one key paused, resumed and limited, with the
same rules as ``PUT /types/{type}/partitions/{key}`` (keys with ``/``, unicode, ``.``), and a
bad argument as one line, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any

import asyncpg
import orjson
import pytest

from conveyor import JobRouter, cli, enqueue
from conveyor.cli.main import build_parser
from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types
from conveyor.store import for_schema

from ..faults.harness import component_env
from ..stack import running_stack
from .test_processes import _env, _run

store = for_schema()
router = JobRouter()


@router.job("cp_sync", partition_by="acct", partition_concurrency=2)
async def sync(job: object) -> None:
    return None


# a Python repr in human output (as test_cli_json.py looks for it)
REPR = re.compile(r"=None\b|=True\b|=False\b|\bNone\b|='|\bdatetime\(")
KEYS = ("a", "org/7 ü", "tab\there")


@pytest.fixture
def run(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Any:
    for name, value in component_env(settings).items():
        if name.startswith("CONVEYOR_"):
            monkeypatch.setenv(name, value)

    async def go(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = await asyncio.to_thread(cli.main, list(argv))
        except SystemExit as exc:  # argparse: a usage error
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return go


async def _jobs(db: asyncpg.Connection) -> None:
    await register_router_types(db, router)
    for i, key in enumerate(KEYS):
        for n in range(i + 1):
            await enqueue(db, "cp_sync", {"acct": key, "n": n})


async def test_the_keys_as_a_table_and_as_the_api_lists_them(
    settings: Settings, db: asyncpg.Connection, run: Any
) -> None:
    await _jobs(db)
    code, out, err = await run("types", "partitions", "cp_sync")
    assert code == 0 and err == "", err
    header, *rows = out.splitlines()
    assert header.split() == ["KEY", "WAITING", "ADMITTED", "RUNNING", "OLDEST", "WAIT",
                              "LIMIT", "PAUSED"]  # fmt: skip
    assert [r.split()[0] for r in rows] == ["a", "org/7", "tab\\there"]  # oldest wait first
    assert rows[1].split()[1:3] == ["ü", "2"]  # the key with a space; its 2 waiting jobs
    assert not REPR.search(out), out
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        api = (await stack.client.get("/types/cp_sync/partitions")).json()["partitions"]
    code, out, err = await run("types", "partitions", "cp_sync", "--json")
    assert code == 0 and err == ""
    lines = [orjson.loads(line) for line in out.splitlines()]
    assert [sorted(line) for line in lines] == [sorted(k) for k in api]
    assert [(k["key"], k["waiting"], k["limit"]) for k in lines] == [
        (k["key"], k["waiting"], k["limit"]) for k in api
    ]

    # a page at a time: the next page's cursor on stderr; --all follows them
    code, out, err = await run("types", "partitions", "cp_sync", "--limit", "1", "--json")
    assert code == 0 and [orjson.loads(x)["key"] for x in out.splitlines()] == ["a"]
    cursor = re.fullmatch(r"more: --cursor (\S+)\n", err)
    assert cursor is not None, err
    code, out, err = await run("types", "partitions", "cp_sync", "--limit", "1", "--cursor",
                               cursor.group(1), "--json")  # fmt: skip
    assert code == 0 and [orjson.loads(x)["key"] for x in out.splitlines()] == ["org/7 ü"]
    code, out, err = await run("types", "partitions", "cp_sync", "--limit", "1", "--all")
    assert code == 0 and err == "", err
    assert len(out.splitlines()) == 1 + len(KEYS)  # one header, every key once


async def test_one_key_paused_limited_and_restored(
    settings: Settings, db: asyncpg.Connection, run: Any
) -> None:
    await _jobs(db)
    code, out, err = await run("types", "partition", "cp_sync", "org/7 ü", "--pause")
    assert code == 0, err
    assert out.startswith("cp_sync key org/7 ü: paused, limit 2, waiting 2,"), out
    assert await store.admit(db, "cp_sync", 100) == 3  # a: 1, tab: 2 (its limit), not org/7
    assert await db.fetchval(
        "SELECT count(*) FROM jobs WHERE partition_key = 'org/7 ü' AND status = 'PENDING'"
    ) == 0  # fmt: skip
    code, out, err = await run("types", "partition", "cp_sync", "org/7 ü", "--concurrency", "5")
    assert code == 0 and "paused, limit 5 (operator's)" in out, out
    code, out, err = await run("types", "partition", "cp_sync", "org/7 ü", "--resume",
                               "--concurrency", "none", "--json")  # fmt: skip
    assert code == 0, err
    view = orjson.loads(out)
    assert (view["paused"], view["concurrency"], view["limit"]) == (False, None, 2)
    assert await db.fetchval("SELECT count(*) FROM partitions") == 0  # nothing left to keep
    # a key the REST path cannot carry is the CLI's to set
    code, out, err = await run("types", "partition", "cp_sync", "..", "--pause")
    assert code == 0 and out.startswith("cp_sync key ..: paused"), out
    code, out, err = await run("types", "partition", "cp_sync", "..")  # no option: shows it
    assert code == 0 and out.startswith("cp_sync key ..: paused"), out
    assert not REPR.search(out), out
    code, out, _ = await run("types", "partitions", "cp_sync")
    assert ".." in [line.split()[0] for line in out.splitlines()]


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["partition", "cp_sync", "a", "--concurrency", "0"], 2, "from 1 to 10000"),
        (["partition", "cp_sync", "a", "--concurrency", "-3"], 2, "from 1 to 10000"),
        (["partition", "cp_sync", "a", "--concurrency", "10001"], 2, "from 1 to 10000"),
        (["partition", "cp_sync", "a", "--concurrency", "two"], 2, "'two' is not a whole number"),
        (["partition", "cp_sync", "x" * 201, "--pause"], 2, "1 to 200 characters"),
        (["partition", "cp_sync", "", "--pause"], 2, "1 to 200 characters"),
        (["partition", "cp_nope", "a", "--pause"], 1, "no job type 'cp_nope'"),
        (["partitions", "cp_nope"], 1, "no job type 'cp_nope'"),
        (["partitions", "cp_sync", "--limit", "0"], 2, "--limit must be from 1 to 1000"),
        (["partitions", "cp_sync", "--limit", "1001"], 2, "--limit must be from 1 to 1000"),
        (["partitions", "cp_sync", "--cursor", "bm9wZQ"], 2, "invalid cursor"),
    ],
)
async def test_a_bad_argument_is_one_line(
    db: asyncpg.Connection, run: Any, argv: list[str], code: int, said: str
) -> None:
    await register_router_types(db, router)
    got, out, err = await run("types", *argv)
    assert (got, out) == (code, ""), (got, out, err)
    assert len(err.strip().splitlines()) == 1 and said in err, err
    assert err.startswith("conveyor types: ") and "Traceback" not in err, err
    assert await db.fetchval("SELECT count(*) FROM partitions") == 0


async def test_the_commands_run_as_processes_and_say_what_they_take(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """The real script (argparse's usage errors, the lazy imports), and help on every option
    and argument."""
    await register_router_types(db, router)
    env = _env(settings)
    code, out, err = await _run(["types", "partition", "cp_sync", "k", "--pause", "--resume"], env)
    assert code == 2 and "not allowed with argument --pause" in err, err
    code, out, err = await _run(["types", "partition", "cp_sync", "k", "--pause"], env)
    assert code == 0 and out.startswith("cp_sync key k: paused"), (out, err)
    for command in ("partitions", "partition"):
        code, out, _ = await _run(["types", command, "--help"], env)
        assert code == 0 and "--json" in out, out
    parser = build_parser()
    for names in (("types", "partitions"), ("types", "partition")):
        sub = parser
        for name in names:
            action = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
            sub = action.choices[name]
        helpless = [a.dest for a in sub._actions if not a.help]
        assert not helpless, (names, helpless)
