"""Operator SQL against a whole Conveyor (docs/operations.md, "Operator SQL"): the supported writes
(``retry_job``, ``cancel_job``) do the whole transition at once, refuse what would lose a
result, and the rescuer, ``stuck_jobs`` and the reconciler catch hand-made states. The
sweeper's loop does not run: its duties are called one step at a time."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import asyncpg
import pytest

from conveyor import Job, JobRouter
from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types
from conveyor.maintenance.sweeper import Sweeper

from .. import db as tdb
from ..stack import Stack, running_stack, wait_for

router = JobRouter()
GATE: dict[str, asyncio.Event] = {}


@router.job("opsql_flaky", max_retries=0)
async def flaky(job: Job) -> dict[str, int]:
    if job.attempt <= int(job.payload.get("fail_until", 0)):
        raise ValueError(f"failing attempt {job.attempt}")
    return {"attempt": job.attempt}


@router.job("opsql_gate", max_retries=0)
async def gate(job: Job) -> dict[str, int]:
    await GATE[str(job.id)].wait()
    return {"attempt": job.attempt}


@asynccontextmanager
async def _stack(
    settings: Settings, *, workers: bool = True
) -> AsyncIterator[tuple[Stack, Sweeper, asyncpg.Connection]]:
    conn = await tdb.connect(settings.database_url)
    await register_router_types(conn, router)
    sweeper = Sweeper(settings)
    await sweeper.start()
    try:
        async with running_stack(settings, router if workers else None, maintenance=False) as s:
            yield s, sweeper, conn
    finally:
        await sweeper.close()
        await conn.close()


async def _row(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record:
    return await conn.fetchrow(
        "SELECT status::text AS status, attempts, retry_count, result::text AS result,"
        " cancel_requested, lease_expires_at FROM jobs WHERE id = $1",
        uuid.UUID(job_id),
    )


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def test_a_pending_job_set_in_progress_by_hand_is_stuck_and_rescued(
    settings: Settings,
) -> None:
    """PENDING → IN_PROGRESS by hand: no claim, no lease. ``stuck_jobs`` lists it and one lease
    recovery pass puts it back (RETRYING through a pen); a worker then completes it. (It was
    stuck for good: a NULL lease was neither expired nor in the view.)"""
    async with _stack(settings, workers=False) as (stack, sweeper, conn):
        job_id = await stack.submit("opsql_flaky", {})
        await conn.execute(
            "UPDATE jobs SET status = 'IN_PROGRESS' WHERE id = $1", uuid.UUID(job_id)
        )
        stuck = await conn.fetch("SELECT id, overdue FROM stuck_jobs")
        assert [r["id"] for r in stuck] == [uuid.UUID(job_id)]
        assert await conn.fetchval("SELECT count(*) FROM backlog WHERE status = 'IN_PROGRESS'")
        assert await sweeper.recover_leases() == {"RETRYING": 1}
        assert await conn.fetchval("SELECT count(*) FROM stuck_jobs") == 0
        row = await _row(conn, job_id)
        assert (row["status"], row["retry_count"], row["lease_expires_at"]) == ("RETRYING", 1, None)
        error = await conn.fetchval("SELECT last_error FROM jobs WHERE id = $1", uuid.UUID(job_id))
        assert "without a lease" in error
        await stack.add_worker(router)
        assert await wait_for(settings.database_url, [job_id]) == {uuid.UUID(job_id): "COMPLETED"}


async def test_retry_job_reruns_a_failed_job_at_once(settings: Settings) -> None:
    """``retry_job`` on a FAILED job: PENDING with fresh retries and an outbox row in one
    statement, so the relay publishes it at once (no reconciler runs here)."""
    async with _stack(settings) as (stack, _sweeper, conn):
        job_id = await stack.submit("opsql_flaky", {"fail_until": 1})
        assert await wait_for(settings.database_url, [job_id]) == {uuid.UUID(job_id): "FAILED"}
        assert await conn.fetchval("SELECT conveyor.retry_job($1)", uuid.UUID(job_id)) == "PENDING"
        assert await wait_for(settings.database_url, [job_id]) == {uuid.UUID(job_id): "COMPLETED"}
        row = await _row(conn, job_id)
        assert (row["attempts"], row["retry_count"], row["result"]) == (2, 0, '{"attempt": 2}')
        outcomes = await conn.fetch(
            "SELECT attempt, outcome FROM job_attempts WHERE job_id = $1 ORDER BY attempt",
            uuid.UUID(job_id),
        )
        assert [tuple(r) for r in outcomes] == [(1, "failed"), (2, "completed")]


async def test_retry_job_publishes_a_waiting_job_now(settings: Settings) -> None:
    """A RETRYING job an hour from its next attempt (a long pen): ``retry_job`` keeps it
    RETRYING, due now, with a fresh message, and it runs at once. Before: only the pen's end."""
    async with _stack(settings, workers=False) as (stack, _sweeper, conn):
        job_id = await stack.submit("opsql_flaky", {})
        await conn.execute(
            "UPDATE jobs SET status = 'RETRYING', attempts = 1, retry_count = 1,"
            " run_at = now() + interval '1 h' WHERE id = $1",
            uuid.UUID(job_id),
        )
        assert await conn.fetchval("SELECT conveyor.retry_job($1)", uuid.UUID(job_id)) == (
            "RETRYING"
        )
        assert await conn.fetchval(
            "SELECT run_at <= now() FROM jobs WHERE id = $1", uuid.UUID(job_id)
        )
        await stack.add_worker(router)
        assert await wait_for(settings.database_url, [job_id]) == {uuid.UUID(job_id): "COMPLETED"}
        row = await _row(conn, job_id)
        assert (row["attempts"], row["retry_count"]) == (2, 1)


async def test_retry_job_refuses_a_running_or_completed_job_and_keeps_its_result(
    settings: Settings,
) -> None:
    """A re-run while the job runs would fence the running attempt's result away; a re-run of
    a COMPLETED job would overwrite its result. ``retry_job`` refuses both with a clear error,
    and the running attempt's result is the one kept."""
    async with _stack(settings) as (stack, _sweeper, conn):
        job_id = await stack.submit("opsql_gate", {})
        GATE[job_id] = asyncio.Event()

        async def running() -> bool:
            return (await _row(conn, job_id))["status"] == "IN_PROGRESS"

        await _until(running)
        with pytest.raises(asyncpg.RaiseError, match="is IN_PROGRESS"):
            await conn.fetchval("SELECT conveyor.retry_job($1)", uuid.UUID(job_id))
        GATE[job_id].set()
        assert await wait_for(settings.database_url, [job_id]) == {uuid.UUID(job_id): "COMPLETED"}
        with pytest.raises(asyncpg.RaiseError, match="is COMPLETED"):
            await conn.fetchval("SELECT conveyor.retry_job($1)", uuid.UUID(job_id))
        row = await _row(conn, job_id)
        assert (row["status"], row["attempts"], row["result"]) == ("COMPLETED", 1, '{"attempt": 1}')
        assert await conn.fetchval("SELECT conveyor.retry_job($1)", uuid.uuid4()) is None


async def test_cancel_job_cancels_a_waiting_job_and_asks_a_running_one(
    settings: Settings,
) -> None:
    """``cancel_job``: a waiting job is CANCELLED at once; a running one is asked (its attempt
    ends CANCELLED, its result discarded), as ``POST /jobs/{id}/cancel`` does."""
    async with _stack(settings) as (stack, _sweeper, conn):
        later = await stack.submit("opsql_flaky", {}, delay_seconds=3600)
        assert await conn.fetchval("SELECT conveyor.cancel_job($1)", uuid.UUID(later)) == (
            "CANCELLED"
        )
        job_id = await stack.submit("opsql_gate", {})
        GATE[job_id] = asyncio.Event()

        async def running() -> bool:
            return (await _row(conn, job_id))["status"] == "IN_PROGRESS"

        await _until(running)
        assert await conn.fetchval("SELECT conveyor.cancel_job($1)", uuid.UUID(job_id)) == (
            "IN_PROGRESS"
        )
        GATE[job_id].set()
        assert await wait_for(settings.database_url, [job_id]) == {uuid.UUID(job_id): "CANCELLED"}
        assert await conn.fetchval("SELECT conveyor.cancel_job($1)", uuid.UUID(job_id)) is None


async def test_a_hand_made_pending_job_is_republished_by_the_reconciler(
    settings: Settings,
) -> None:
    """FAILED → PENDING by hand (not supported: no outbox row, no fresh retries). The
    reconciler's two passes find it once it is ``reconcile_after`` old, and it runs again."""
    async with _stack(settings) as (stack, sweeper, conn):
        job_id = await stack.submit("opsql_flaky", {"fail_until": 1})
        assert await wait_for(settings.database_url, [job_id]) == {uuid.UUID(job_id): "FAILED"}
        await conn.execute(
            "UPDATE jobs SET status = 'PENDING', finished_at = NULL,"
            " updated_at = now() - make_interval(secs => $2) WHERE id = $1",
            uuid.UUID(job_id),
            settings.reconcile_after + 1,
        )
        assert [await sweeper.reconcile() for _ in range(2)] == [0, 1]
        assert await wait_for(settings.database_url, [job_id]) == {uuid.UUID(job_id): "COMPLETED"}
