"""Sweeper duties when a peer is paused in the middle of one (VM freeze, long GC): its
connection stays open, so only PostgreSQL can release what it holds. Promote (and retention)
hold nothing between round trips; a paused reconcile of a type, or a paused lease recovery, is
ended by PostgreSQL's bound and another sweeper takes the duty over within seconds. The pause is an
``await`` that does not return, wrapped from outside around one store method of one sweeper."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from conveyor import JobSpec, enqueue_many
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper


class PausesAfter:
    """A store whose method ``name`` freezes its caller once that statement has returned."""

    def __init__(self, store: Any, name: str) -> None:
        self._store, self._name = store, name
        self.paused, self.resume = asyncio.Event(), asyncio.Event()

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._store, attr)
        if attr != self._name:
            return value

        async def pausing(*args: Any, **kw: Any) -> Any:
            result = await value(*args, **kw)
            self.paused.set()
            await self.resume.wait()
            return result

        return pausing


def _depth(n: int) -> Callable[[str], Awaitable[int]]:
    async def depth(job_type: str) -> int:
        return n

    return depth


async def _paused(settings: Settings, name: str) -> tuple[Sweeper, PausesAfter]:
    s = Sweeper(settings.model_copy(update={"reconcile_after": 30}))
    await s.start()
    wrapped = PausesAfter(s.store, name)
    s.store = wrapped  # type: ignore[assignment]
    return s, wrapped


async def test_a_paused_promote_holds_no_job(settings: Settings, db: asyncpg.Connection) -> None:
    ids = await enqueue_many(db, [JobSpec("later", delay_seconds=60) for _ in range(5)])
    await db.execute("UPDATE jobs SET run_at = now() - interval '1 s'")
    a, store = await _paused(settings, "job_promote_due")
    task = asyncio.create_task(a.promote_due())
    try:
        await asyncio.wait_for(store.paused.wait(), 10)
        # frozen right after its statement: what it promoted is visible (committed) already
        n = await db.fetchval("SELECT count(*) FROM jobs WHERE status = 'PENDING'")
        assert n == len(ids), f"{n} of {len(ids)} promoted jobs visible while the sweeper is paused"
    finally:
        store.resume.set()
        with contextlib.suppress(Exception):
            await task
        await a.close()


async def test_a_paused_reconcile_is_taken_over_within_seconds(
    settings: Settings, db: asyncpg.Connection
) -> None:
    await enqueue_many(db, [JobSpec("lost") for _ in range(3)])
    await db.execute("DELETE FROM job_outbox")  # relayed, then the messages vanished
    await db.execute("UPDATE jobs SET updated_at = now() - interval '31 s'")
    a, store = await _paused(settings, "job_recount_overdue")  # inside the type's lock
    b = Sweeper(settings.model_copy(update={"reconcile_after": 30}))
    await b.start()
    task = asyncio.create_task(a.reconcile(queue_depth=_depth(0)))
    try:
        await asyncio.wait_for(store.paused.wait(), 10)
        started = time.monotonic()
        republished = 0
        while republished < 3 and time.monotonic() - started < 15:
            republished += await b.reconcile(queue_depth=_depth(0))
            await asyncio.sleep(0.25)
        took = time.monotonic() - started
        print(f"[paused reconcile] the peer re-published {republished} of 3 in {took:.1f} s")
        assert republished == 3 and took < 10, f"{republished} of 3 re-published in {took:.1f} s"
    finally:
        store.resume.set()
        with contextlib.suppress(Exception):
            await task
        await asyncio.gather(a.close(), b.close())
    assert await db.fetchval("SELECT count(*) FROM job_outbox") == 3  # once each


async def test_a_paused_lease_recovery_is_taken_over_within_seconds(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """Lease recovery's transaction (``Sweeper._recover``) holds the rows it recovers until its
    commit: paused in between, PostgreSQL ends its session by the transaction's own idle bound,
    also where the session has none (here: off), and a peer recovers the jobs."""
    ids = await enqueue_many(db, [JobSpec("t") for _ in range(3)])
    await db.execute("DELETE FROM job_outbox")
    await db.execute("UPDATE jobs SET status = 'IN_PROGRESS', attempts = 1,"
                     " lease_expires_at = now() - interval '1 s'")  # fmt: skip
    unbounded = settings.model_copy(update={"db_idle_in_transaction_timeout": 0})
    a, store = await _paused(unbounded, "job_recover_expired")  # inside its transaction
    b = Sweeper(unbounded)
    await b.start()
    task = asyncio.create_task(a.recover_leases())

    async def recovered() -> int:
        return int(
            await db.fetchval(
                "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[]) AND status = 'RETRYING'",
                ids,
            )
        )

    try:
        await asyncio.wait_for(store.paused.wait(), 10)
        started = time.monotonic()
        while await recovered() < 3 and time.monotonic() - started < 15:
            await b.recover_leases()
            await asyncio.sleep(0.25)
        took = time.monotonic() - started
        done = await recovered()
        print(f"[paused lease recovery] {done} of 3 recovered {took:.1f} s into the pause")
        assert done == 3 and took < 10, f"{done} of 3 recovered in {took:.1f} s"
    finally:
        store.resume.set()
        with contextlib.suppress(Exception):
            await task
        await asyncio.gather(a.close(), b.close())
