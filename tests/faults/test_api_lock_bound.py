"""The lock bound in the API, as an adversary: a real ``conveyor api`` process whose request
must take a row lock that another connection holds in an open transaction (a paused peer, an
operator's forgotten ``BEGIN; SELECT … FOR UPDATE``).

With ``CONVEYOR_DB_LOCK_TIMEOUT=1`` each such request (a unique-key submit, the same in a
batch, a cancel, a type's limits) answers 503 about a second later, not a hang and not a 500,
writes nothing, and succeeds once the lock is released. ``CONVEYOR_DB_TIMEOUT`` is 4 s here so
that only the lock bound can answer that fast (the API's command timeout, 1.5 s by default, also
ends an ordinary statement's wait; the log names which one answered).

The control, the bound off (``0``): the batch, whose insert runs without a command timeout
(``Api.long``: as long as the server answers probes), waits past the client's timeout and is
still waiting on the server after the client gave up; a cancel is ended by its own lock bound
(``bounds.local_bounds``: under the command timeout, so the server ends the wait and the 503
says the job is locked), which the session's bound being off does not lift."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from conveyor.core.config import Settings
from conveyor.store.bounds import local_bounds
from conveyor.store.connect import database_name

from .. import db as tdb
from .harness import Proc, component_env, conveyor_command, http_ok
from .infra import free_port

DB_TIMEOUT = 4.0  # the API's command timeout, above the lock bound
CLIENT_TIMEOUT = 6.0


@contextlib.asynccontextmanager
async def _api(settings: Settings, tmp_path: Path, lock_bound: float) -> AsyncIterator[Any]:
    """``conveyor api`` on a free port with the lock bound; yields (process, client)."""
    env = component_env(settings, CONVEYOR_DB_TIMEOUT=str(DB_TIMEOUT),
                        CONVEYOR_DB_LOCK_TIMEOUT=str(lock_bound))  # fmt: skip
    port = free_port()
    proc = Proc("api", [*conveyor_command(), "api", "--port", str(port)], env, tmp_path).start()
    try:
        await http_ok(port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     timeout=CLIENT_TIMEOUT) as client:  # fmt: skip
            yield proc, client
    finally:
        await proc.stop()


@contextlib.asynccontextmanager
async def _holding(url: str, statement: str, *args: Any) -> AsyncIterator[asyncpg.Connection]:
    """A transaction of another connection holds the row lock ``statement`` takes, until the
    block ends (then it rolls back)."""
    conn = await tdb.connect(url)
    try:
        tx = conn.transaction()
        await tx.start()
        assert await conn.fetch(statement, *args), "locked no row"
        yield conn
        await tx.rollback()
    finally:
        await conn.close()


async def _timed(client: httpx.AsyncClient, method: str, path: str, **kw: Any) -> Any:
    started = time.monotonic()
    r = await client.request(method, path, **kw)
    return r, time.monotonic() - started


async def _state(db: asyncpg.Connection) -> tuple[Any, ...]:
    """Everything a request could have written here."""
    return (
        await db.fetchval("SELECT count(*) FROM jobs"),
        await db.fetchval("SELECT count(*) FROM job_outbox"),
        tuple(await db.fetch("SELECT key, job_id, expires_at FROM job_uniques ORDER BY key")),
        tuple(await db.fetch("SELECT id, status::text, cancel_requested FROM jobs ORDER BY id")),
        tuple(await db.fetch("SELECT name, concurrency FROM job_types ORDER BY name")),
    )


async def _expired_key(client: httpx.AsyncClient, db: asyncpg.Connection, key: str) -> str:
    """A unique key held by a job whose window is over: the next submit with it claims it
    (``ON CONFLICT … DO UPDATE``), which needs the key's row lock."""
    r = await client.post("/jobs", json={"type": "work", "payload": {"k": key},
                                         "unique_key": key, "unique_for": 600})  # fmt: skip
    assert r.status_code == 201, r.text
    holder = r.json()["id"]
    await db.execute("UPDATE job_uniques SET expires_at = now() - interval '1 s'"
                     " WHERE job_id = $1", uuid.UUID(holder))  # fmt: skip
    return str(holder)


LOCK_KEY = "SELECT 1 FROM job_uniques WHERE job_id = $1 FOR UPDATE"


async def test_a_row_lock_held_elsewhere_answers_503_within_the_lock_bound(
    fsettings: Settings, tmp_path: Path
) -> None:
    url = fsettings.database_url
    db = await tdb.connect(url)
    try:
        async with _api(fsettings, tmp_path, lock_bound=1.0) as (proc, client):
            single = await _expired_key(client, db, "single")
            batch = await _expired_key(client, db, "batch")
            victim = await client.post("/jobs", json={"type": "work", "payload": {}})
            assert victim.status_code == 201, victim.text
            job = victim.json()["id"]
            limits = {"concurrency": 7}
            cases: list[tuple[str, str, str, dict[str, Any], str, tuple[Any, ...]]] = [
                ("unique submit", "POST", "/jobs", {"json": {
                    "type": "work", "payload": {"k": "single"}, "unique_key": "single",
                    "unique_for": 600}}, LOCK_KEY, (uuid.UUID(single),)),
                ("unique batch", "POST", "/jobs/batch", {"json": {"jobs": [{
                    "type": "work", "payload": {"k": "batch"}, "unique_key": "batch",
                    "unique_for": 600}]}}, LOCK_KEY, (uuid.UUID(batch),)),
                ("cancel", "POST", f"/jobs/{job}/cancel", {},
                 "SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", (uuid.UUID(job),)),
                ("limits", "PUT", "/types/work/limits", {"json": limits},
                 "SELECT 1 FROM job_types WHERE name = $1 FOR UPDATE", ("work",)),
            ]  # fmt: skip
            took: dict[str, float] = {}
            for name, method, path, kw, lock, args in cases:
                before = await _state(db)
                async with _holding(url, lock, *args):
                    r, took[name] = await _timed(client, method, path, **kw)
                    assert r.status_code == 503, (name, r.status_code, r.text)
                    assert r.json()["error"] == "service_unavailable", r.text
                    assert 0.9 < took[name] < 2.5, (name, took[name])
                    assert await _state(db) == before, f"{name}: written under a 503"
                    assert not await _lock_waiters(url), f"{name}: the API still waits"
                r, _ = await _timed(client, method, path, **kw)  # released: the same request
                assert r.status_code in (200, 201), (name, r.status_code, r.text)
                if name == "unique submit":
                    assert r.json()["duplicate"] is False and r.json()["id"] != single
                elif name == "unique batch":
                    assert r.json()["jobs"][0]["duplicate"] is False
                elif name == "cancel":
                    assert r.json()["status"] == "CANCELLED", r.text
                else:
                    assert r.json()["concurrency"] == 7, r.text
            log = proc.log()
        print("[faults] lock bound 1 s, API answered 503 after "
              + ", ".join(f"{n} {t:.2f} s" for n, t in took.items()))  # fmt: skip
        # the lock bound answered, each time (not the 4 s command timeout), and nothing a 500
        assert log.count("LockNotAvailableError") == len(cases), log[-3000:]
        assert "api_unexpected_error" not in log and "Traceback" not in log, log[-3000:]
        # the new holders of the keys, each with its outbox row
        for key in ("single", "batch"):
            row = await db.fetchrow(
                "SELECT j.status::text AS status, (SELECT count(*) FROM job_outbox o"
                " WHERE o.job_id = j.id) AS outbox FROM job_uniques k JOIN jobs j"
                " ON j.id = k.job_id WHERE k.key LIKE '%' || $1",
                key,
            )
            assert row is not None and row["status"] == "PENDING" and row["outbox"] == 1, key
    finally:
        await db.close()


async def _lock_waiters(url: str) -> list[str]:
    """The API's backends waiting for a lock."""
    conn = await tdb.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT left(query, 60) AS q FROM pg_stat_activity WHERE datname = $1"
            " AND application_name = 'conveyor-api' AND wait_event_type = 'Lock'",
            database_name(url),
        )
    finally:
        await conn.close()
    return [r["q"] for r in rows]


async def test_without_the_lock_bound_a_unique_batch_waits_past_the_client(
    fsettings: Settings, tmp_path: Path
) -> None:
    url = fsettings.database_url
    db = await tdb.connect(url)
    try:
        async with _api(fsettings, tmp_path, lock_bound=0.0) as (proc, client):
            holder = await _expired_key(client, db, "batch")
            body = {"jobs": [{"type": "work", "payload": {"k": "batch"}, "unique_key": "batch",
                              "unique_for": 600}]}  # fmt: skip
            async with _holding(url, LOCK_KEY, uuid.UUID(holder)):
                started = time.monotonic()
                with pytest.raises(httpx.ReadTimeout):
                    await client.post("/jobs/batch", json=body)
                waited = time.monotonic() - started
                assert await _lock_waiters(url), "the API's insert no longer waits"
            # released: the abandoned request goes on and commits, nobody hears its answer
            deadline = time.monotonic() + 10
            while await db.fetchval("SELECT job_id FROM job_uniques WHERE key LIKE '%batch'") \
                    == uuid.UUID(holder):  # fmt: skip
                assert time.monotonic() < deadline, "the abandoned request never finished"
                await asyncio.sleep(0.1)

            victim = await client.post("/jobs", json={"type": "work", "payload": {}})
            job = victim.json()["id"]
            lock = "SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE"
            async with _holding(url, lock, uuid.UUID(job)):
                r, cancel_took = await _timed(client, "POST", f"/jobs/{job}/cancel")
            assert r.status_code == 503, r.text
            log = proc.log()
        _, cancel_bound = local_bounds(DB_TIMEOUT, 0.0)
        print(f"[faults] lock bound off: the unique batch still waited when the client gave up "
              f"({waited:.1f} s); a cancel answered 503 after {cancel_took:.2f} s (its own lock "
              f"bound, {cancel_bound:g} s, under the command timeout, {DB_TIMEOUT} s)")  # fmt: skip
        assert cancel_bound - 0.1 < cancel_took < cancel_bound + 1.5
        assert "is locked by another transaction" in r.json()["detail"], r.text
        # the cancel's own bound answered (no command timeout), and only the cancel's
        assert log.count("LockNotAvailableError") == 1 and "TimeoutError" not in log, log[-3000:]
    finally:
        await db.close()
