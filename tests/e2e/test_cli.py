"""The operator commands as a shell user meets them: a database or broker that
cannot be used is one line, never a traceback; `conveyor jobs list | head -1` ends quietly;
pages with `--cursor` and `--all`; `--json` is JSON Lines of what the API answers."""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import orjson

from conveyor import JobSpec, enqueue_many
from conveyor.cli.support import EXIT_PIPE, CliError, confirm
from conveyor.core.config import Settings

from .. import db as tdb
from .test_processes import CONVEYOR, ROOT, _env, _run


async def test_an_unusable_database_or_broker_is_one_line(settings: Settings) -> None:
    host = settings.database_url.rsplit("/", 1)[0]
    cases = [
        (["jobs", "list"], {"CONVEYOR_DATABASE_URL": f"{host}/conveyor_no_such_database"},
         ["database 'conveyor_no_such_database' does not exist", "run `conveyor migrate`"]),
        (["jobs", "show", str(uuid.uuid4())],
         {"CONVEYOR_DATABASE_URL": "postgresql://postgres:s3cret@127.0.0.1:1/conveyor"},
         ["cannot use PostgreSQL at postgresql://postgres:***@127.0.0.1:1/conveyor"]),
        (["types", "list"], {"CONVEYOR_DB_SCHEMA": "never_migrated"},
         ["database schema 'never_migrated' is not migrated", "run `conveyor migrate`"]),
        (["dlq", "list"], {"CONVEYOR_AMQP_URL": "amqp://guest:s3cret@127.0.0.1:1/"},
         ["cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:1/"]),
        (["jobs", "list", "--cursor", "not-a-cursor"], {}, ["invalid cursor"]),
        # every command that reads the database says it the same way (support.database)
        (["keys", "list"], {"CONVEYOR_DB_SCHEMA": "never_migrated"},
         ["database schema 'never_migrated' is not migrated", "run `conveyor migrate`"]),
        (["schedules", "list"],
         {"CONVEYOR_DATABASE_URL": "postgresql://postgres:s3cret@127.0.0.1:1/conveyor"},
         ["cannot use PostgreSQL at postgresql://postgres:***@127.0.0.1:1/conveyor"]),
    ]  # fmt: skip
    results = await asyncio.gather(*(_run(args, _env(settings, **env)) for args, env, _ in cases))
    for (args, _, expected), (code, out, err) in zip(cases, results, strict=True):
        assert code == 2 and out == "", (args, err)
        assert len(err.strip().splitlines()) == 1, (args, err)
        assert err.startswith(f"conveyor {args[0]}: "), err
        assert all(e in err for e in expected), (args, err)
        assert "Traceback" not in err and "s3cret" not in err


async def test_a_closed_pipe_ends_the_listing_quietly(settings: Settings, db_url: str) -> None:
    conn = await tdb.connect(db_url)
    try:
        await enqueue_many(conn, [JobSpec("noop", {"n": i}) for i in range(1500)], notify=False)
    finally:
        await conn.close()
    for extra in ([], ["--json"]):  # ~130 / ~700 KB: more than the pipe and stdout buffers
        proc = subprocess.Popen(
            [*CONVEYOR, "jobs", "list", "--all", "--limit", "200", *extra],
            env=_env(settings), cwd=ROOT, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()  # `| head -1`
        proc.stdout.close()
        code = proc.wait(timeout=60)
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert first.strip() and err == "" and code == EXIT_PIPE, (code, err)


async def test_pages_and_json_lines(settings: Settings, db_url: str) -> None:
    conn = await tdb.connect(db_url)
    try:
        ids = await enqueue_many(conn, [JobSpec("noop", {"n": i}) for i in range(5)])
    finally:
        await conn.close()
    newest_first = sorted((str(i) for i in ids), reverse=True)  # ORDER BY id DESC
    env = _env(settings)
    code, out, err = await _run(["jobs", "list", "--limit", "2", "--json"], env)
    first = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and all(j["type"] == "noop" and j["status"] == "PENDING" for j in first)
    assert err.startswith("more: --cursor ")
    code, out, err = await _run(["jobs", "list", "--limit", "3", "--cursor", err.split()[-1]], env)
    rest = [line.split()[0] for line in out.splitlines()]
    assert code == 0 and err == ""  # the last page: no cursor
    assert [j["id"] for j in first] + rest == newest_first
    code, out, err = await _run(["jobs", "list", "--all", "--limit", "2"], env)
    assert (
        code == 0 and err == "" and [line.split()[0] for line in out.splitlines()] == newest_first
    )


class _Stdin:
    def __init__(self, tty: bool, answer: str) -> None:
        self.tty, self.answer = tty, answer

    def isatty(self) -> bool:
        return self.tty

    def readline(self) -> str:
        return self.answer


def test_a_bulk_change_needs_a_yes() -> None:
    assert confirm("Purge 3?", yes=True, stdin=_Stdin(False, ""))
    assert confirm("Purge 3?", yes=False, stdin=_Stdin(True, "y\n"))
    assert confirm("Purge 3?", yes=False, stdin=_Stdin(True, "YES\n"))
    assert not confirm("Purge 3?", yes=False, stdin=_Stdin(True, "\n"))
    assert not confirm("Purge 3?", yes=False, stdin=_Stdin(True, "no\n"))
    try:
        confirm("Purge 3?", yes=False, stdin=_Stdin(False, "y\n"))  # a script, not a person
    except CliError as exc:
        assert "pass --yes" in str(exc)
    else:
        raise AssertionError("confirmed without a terminal")
