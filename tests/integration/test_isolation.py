"""No single job stalls a duty for the others. A job whose settling statement fails (a trigger
planted here raises for it, or waits for a lock the test holds past the lock bound) is set
aside: the rest of its batch settles in the same pass, the job is logged with its id and tried
again alone after 1 s, doubling to 60 s. The duties: the sweeper's lease recovery (one step:
``recover_leases``), the worker's outcome writes (``Completer.flush_once``) and the API's
cancel, which answers a clear 503 within its own bound when the job's row is locked."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from conveyor import Job, JobSpec, enqueue_many
from conveyor.core.config import Settings
from conveyor.core.metrics import Metrics
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import for_schema
from conveyor.store.bounds import SessionBounds
from conveyor.store.connect import create_pool, database_name
from conveyor.worker import outcomes
from conveyor.worker.completer import Completer, Pending
from conveyor.worker.running import Running

from .. import db as tdb
from ..stack import running_stack

store = for_schema()
LOCK_KEY = 733_001  # the advisory lock a planted trigger waits for
LOCK_BOUND = 1.0  # seconds: the lock bound of the sessions whose lock waits the tests pass


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _plant(db: asyncpg.Connection, job_id: uuid.UUID, body: str) -> None:
    """A trigger that runs ``body`` when ``job_id``'s status is about to change."""
    await db.execute(
        "CREATE FUNCTION planted() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN {body}; RETURN NEW; END $$"
    )
    await db.execute(
        "CREATE TRIGGER planted BEFORE UPDATE ON jobs FOR EACH ROW WHEN (OLD.id = "
        f"'{job_id}'::uuid AND NEW.status IS DISTINCT FROM OLD.status) "
        "EXECUTE FUNCTION planted()"
    )


async def _unplant(db: asyncpg.Connection) -> None:
    await db.execute("DROP TRIGGER planted ON jobs")
    await db.execute("DROP FUNCTION planted()")


RAISES = "RAISE EXCEPTION 'planted: job % refuses to settle', OLD.id"
WAITS = f"PERFORM pg_advisory_xact_lock({LOCK_KEY})"


def _logged(caplog: Any, action: str) -> list[dict[str, Any]]:
    return [r.__dict__["fields"] for r in caplog.records if r.getMessage() == action]


# ---------------------------------------------------------------------- lease recovery


async def _expired(db: asyncpg.Connection, n: int) -> list[uuid.UUID]:
    """``n`` jobs claimed by a worker that died: their leases expired, oldest first."""
    ids = await enqueue_many(db, [JobSpec("t") for _ in range(n)])
    await db.execute("DELETE FROM job_outbox")
    await store.job_claim_many(
        db, ids, lease_seconds=5.0, worker_id="dead-worker", types=["t"], handler_defaults={},
        default_max_retries=3,
    )  # fmt: skip
    for i, job_id in enumerate(ids):
        await db.execute(
            "UPDATE jobs SET lease_expires_at = now() - make_interval(secs => $2) WHERE id = $1",
            job_id,
            100.0 - i,
        )
    return ids


async def _passes(
    sweeper: Sweeper, db: asyncpg.Connection, six: list[uuid.UUID], n: int
) -> tuple[list[int], list[str]]:
    """``n`` passes of lease recovery: the six recovered after each, and the passes' errors."""
    recovered, errors = [], []
    for _ in range(n):
        try:
            await sweeper.recover_leases()
        except Exception as exc:  # a pass that fails whole (kept to count it)
            errors.append(repr(exc)[:200])
        recovered.append(
            await db.fetchval(
                "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[]) AND status = 'RETRYING'",
                six,
            )
        )
    return recovered, errors


@contextlib.asynccontextmanager
async def _sweeper(settings: Settings, clock: Clock) -> AsyncIterator[Sweeper]:
    s = Sweeper(settings, clock=clock)
    await s.start()
    try:
        yield s
    finally:
        await s.close()


async def _status(db: asyncpg.Connection, job_id: uuid.UUID) -> str:
    return str(await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", job_id))


async def test_a_job_whose_recovery_fails_does_not_hold_back_six_expired_leases(
    db: asyncpg.Connection, settings: Settings, caplog: Any
) -> None:
    bad, *six = await _expired(db, 7)
    await _plant(db, bad, RAISES)
    clock = Clock()
    async with _sweeper(settings, clock) as sweeper:
        recovered, errors = await _passes(sweeper, db, six, 3)
        print(f"[isolation] a failing recovery beside 6 expired leases: recovered {recovered} "
              f"after passes 1-3, passes failed: {len(errors)}")  # fmt: skip
        assert recovered == [6, 6, 6] and errors == [], (recovered, errors)
        assert await _status(db, bad) == "IN_PROGRESS"
        [failed] = _logged(caplog, "job_lease_recovery_failed")  # set aside: not tried again
        assert failed["job_id"] == str(bad) and failed["retry_in"] == 1.0, failed
        assert "planted: job" in failed["error"], failed

        clock.now += 1.0  # its wait is over: tried again alone, fails again, waits twice as long
        assert await sweeper.recover_leases() == {}
        assert [f["retry_in"] for f in _logged(caplog, "job_lease_recovery_failed")] == [1, 2]
        clock.now += 1.0
        assert await sweeper.recover_leases() == {}  # still waiting
        await _unplant(db)
        clock.now += 1.0
        assert await sweeper.recover_leases() == {"RETRYING": 1}
        assert await _status(db, bad) == "RETRYING"
        assert len(_logged(caplog, "job_lease_recovery_failed")) == 2


async def test_a_job_whose_recovery_waits_past_the_lock_bound_does_not_hold_back_six(
    db: asyncpg.Connection, settings: Settings, caplog: Any
) -> None:
    bad, *six = await _expired(db, 7)
    await _plant(db, bad, WAITS)
    await db.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)  # held: the trigger waits
    clock = Clock()
    locked = settings.model_copy(update={"db_lock_timeout": LOCK_BOUND})
    async with _sweeper(locked, clock) as sweeper:
        started = time.monotonic()
        recovered, errors = await _passes(sweeper, db, six, 1)
        took = time.monotonic() - started
        print(f"[isolation] a recovery held past its {LOCK_BOUND} s lock bound beside 6 expired "
              f"leases: "
              f"recovered {recovered[0]} of 6 in the first pass ({took:.1f} s), "
              f"passes failed: {len(errors)}")  # fmt: skip
        assert recovered == [6] and errors == [], (recovered, errors)
        [failed] = _logged(caplog, "job_lease_recovery_failed")
        assert failed["job_id"] == str(bad) and "LockNotAvailable" in failed["error"], failed
        await db.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)
        clock.now += 1.0
        assert await sweeper.recover_leases() == {"RETRYING": 1}
    assert await _status(db, bad) == "RETRYING"


# ---------------------------------------------------------------------- outcome writes


async def _claimed(db: asyncpg.Connection, n: int) -> list[Running]:
    ids = await enqueue_many(db, [JobSpec("t", {"i": i}) for i in range(n)])
    rows = await store.job_claim_many(
        db, ids, lease_seconds=30.0, worker_id="test-worker", types=["t"],
        handler_defaults={}, default_max_retries=3,
    )  # fmt: skip
    by_id = {r.id: r for r in rows}
    return [
        Running(Job(i, "t", {}, by_id[i].attempts, 5, 0, 0), None, None, time.monotonic())
        for i in ids
    ]


async def _completed(db: asyncpg.Connection, ids: list[uuid.UUID]) -> int:
    return int(
        await db.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[]) AND status = 'COMPLETED'", ids
        )
    )


async def _until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "not within the timeout"
        await asyncio.sleep(0.02)


async def test_the_completer_sets_aside_an_outcome_that_fails_and_writes_the_others(
    db: asyncpg.Connection, db_url: str, caplog: Any
) -> None:
    pool = await create_pool(db_url, application_name="test-isolation", max_size=3)
    done: list[Pending] = []

    async def record(batch: list[Pending]) -> None:
        done.extend(batch)

    clock = Clock()
    completer = Completer(pool, store, Metrics(), done=record, clock=clock)
    flush: asyncio.Task[int] | None = None
    try:
        runs = await _claimed(db, 7)
        bad = runs[3]
        six = [r.job.id for r in runs if r is not bad]
        await _plant(db, bad.job.id, RAISES)
        for r in runs:
            completer.put(r, outcomes.completed({"ok": True}))
        started = time.monotonic()
        flush = asyncio.create_task(completer.flush_once())
        await asyncio.wait({flush}, timeout=10)
        took = time.monotonic() - started
        landed = await _completed(db, six)
        print(f"[isolation] an outcome write that fails beside 6 others: {landed} of 6 landed, "
              f"the flush {'returned' if flush.done() else 'still retrying'} after "
              f"{took:.1f} s")  # fmt: skip
        assert flush.done() and await flush == 7 and landed == 6, (landed, took)
        assert {p.running.job.id for p in done} == set(six)
        status = completer.status()
        assert (status.waiting, status.isolated, status.oldest_since) == (1, 1, None), status
        [isolated] = _logged(caplog, "outcome_write_isolated")
        assert isolated["job_id"] == str(bad.job.id) and isolated["retry_in"] == 1.0, isolated

        clock.now += 1.0  # tried again alone: fails again, waits twice as long
        assert await completer.flush_once() == 1
        await _until(lambda: _count(caplog, "outcome_write_isolated", 2))
        assert _logged(caplog, "outcome_write_isolated")[1]["retry_in"] == 2.0
        assert completer.status().isolated == 1
        await _unplant(db)
        clock.now += 2.0
        assert await completer.flush_once() == 1

        async def settled() -> bool:
            return completer.status().waiting == 0

        await _until(settled)
        assert await _completed(db, [bad.job.id]) == 1
        assert len(done) == 7 and all(p.written for p in done)
        assert completer.status().isolated == 0
    finally:
        if flush is not None and not flush.done():
            flush.cancel()
        await pool.close()


async def _count(caplog: Any, action: str, n: int) -> bool:
    return len(_logged(caplog, action)) >= n


async def test_the_completer_writes_the_others_one_by_one_past_a_row_lock_held_past_the_bound(
    db: asyncpg.Connection, db_url: str, caplog: Any
) -> None:
    """Each try of a batch held by a row lock waits a whole lock bound: the batch is then
    written one outcome at a time (halves would wait one bound per level), and the locked one
    is set aside until the lock goes."""
    bounds = SessionBounds(0, LOCK_BOUND, 0, 0, 0, 0, 0)
    pool = await create_pool(db_url, application_name="test-isolation", max_size=3, bounds=bounds)
    done: list[Pending] = []

    async def record(batch: list[Pending]) -> None:
        done.extend(batch)

    clock = Clock()
    completer = Completer(pool, store, Metrics(), done=record, clock=clock)
    locker = await tdb.connect(db_url)
    try:
        runs = await _claimed(db, 7)
        bad = runs[5]
        six = [r.job.id for r in runs if r is not bad]
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", bad.job.id)
        for r in runs:
            completer.put(r, outcomes.completed({"ok": True}))
        started = time.monotonic()
        assert await asyncio.wait_for(completer.flush_once(), 10) == 7
        took = time.monotonic() - started
        print(f"[isolation] an outcome held by a row lock past its {LOCK_BOUND} s bound beside 6 "
              f"others: {await _completed(db, six)} of 6 written in {took:.1f} s")  # fmt: skip
        assert await _completed(db, six) == 6 and took < 4 * LOCK_BOUND, took
        [isolated] = _logged(caplog, "outcome_write_isolated")
        assert isolated["job_id"] == str(bad.job.id), isolated
        assert "LockNotAvailable" in isolated["error"], isolated
        assert completer.status().isolated == 1
        await tx.rollback()
        clock.now += 1.0
        assert await completer.flush_once() == 1

        async def settled() -> bool:
            return completer.status().waiting == 0

        await _until(settled)
        assert await _completed(db, [bad.job.id]) == 1 and len(done) == 7
    finally:
        await locker.close()
        await pool.close()


# ---------------------------------------------------------------------- the API's cancel


async def _api_backends(db: asyncpg.Connection, url: str) -> set[int]:
    rows = await db.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = 'conveyor-api'",
        database_name(url),
    )
    return {r["pid"] for r in rows}


async def _lock_waiters(db: asyncpg.Connection, url: str) -> int:
    return int(
        await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
            " AND application_name = 'conveyor-api' AND wait_event_type = 'Lock'",
            database_name(url),
        )
    )


@pytest.mark.serial  # its assertion is a bound in seconds
async def test_a_cancel_of_a_locked_job_answers_a_clear_503_within_its_bound(
    db: asyncpg.Connection, settings: Settings
) -> None:
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        job = await stack.submit("t")
        other = await tdb.connect(settings.database_url)
        try:
            tx = other.transaction()
            await tx.start()
            await other.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", uuid.UUID(job))
            backends = await _api_backends(db, settings.database_url)
            started = time.monotonic()
            r = await stack.client.post(f"/jobs/{job}/cancel")
            took = time.monotonic() - started
            waiters = await _lock_waiters(db, settings.database_url)
            kept = backends <= await _api_backends(db, settings.database_url)
            await tx.rollback()
        finally:
            await other.close()
        print(f"[isolation] a cancel of a locked job: {r.status_code} after {took:.2f} s "
              f"(db_timeout {settings.db_timeout} s): {r.text}")  # fmt: skip
        assert r.status_code == 503, r.text
        assert took < settings.db_timeout, took
        body = r.json()
        assert body["error"] == "service_unavailable" and "locked" in body["detail"], body
        assert job in body["detail"], body
        assert waiters == 0, "the API still waits for the lock"
        assert backends and kept, "the cancel's connection was dropped, not returned to the pool"
        assert await _status(db, uuid.UUID(job)) == "PENDING"
        r = await stack.client.post(f"/jobs/{job}/cancel")  # released: the same request
        assert r.status_code == 200 and r.json()["status"] == "CANCELLED", r.text
