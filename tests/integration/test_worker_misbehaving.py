"""What a misbehaving handler can and cannot do to a worker.

Each test ends with a well-behaved job completing on the same worker: a misbehaving handler may
fail its own job, never the worker."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from conveyor.core.config import Settings

from .. import db as tdb
from ..stack import running_stack, wait_for
from . import worker_apps
from .worker_apps import router


async def _row(db_url: str, job_id: str) -> asyncpg.Record:
    conn = await tdb.connect(db_url)
    try:
        row = await conn.fetchrow(
            "SELECT status::text AS status, attempts, retry_count, last_error, result::text,"
            " run_at - updated_at AS wait FROM jobs WHERE id = $1",
            uuid.UUID(job_id),
        )
    finally:
        await conn.close()
    assert row is not None
    return row


# A result or an error text PostgreSQL refuses is a recorded failure, not an outcome write that
# fails for ever (the job IN_PROGRESS, heartbeats keeping its lease, no later job on that worker
# completing: the jobs would still be IN_PROGRESS after 20 s).


async def test_an_unwritable_outcome_fails_its_job_and_the_worker_goes_on(
    settings: Settings, db_url: str
) -> None:
    async with running_stack(settings, router, concurrency=4) as stack:
        bad_result = await stack.submit("nul_result")
        bad_error = await stack.submit("nul_error")
        statuses = await wait_for(db_url, [bad_result, bad_error], timeout=20)
        assert set(statuses.values()) == {"FAILED"}, statuses
        later = await stack.submit("echo", {"after": "the bad ones"})
        assert (await wait_for(db_url, [later], timeout=20)) == {uuid.UUID(later): "COMPLETED"}
    r = await _row(db_url, bad_result)
    assert "could not be stored" in r["last_error"] and "\x00" not in r["last_error"]
    assert r["result"] is None
    e = await _row(db_url, bad_error)
    assert "bad byte  here" in e["last_error"], e["last_error"]  # the NUL removed, text kept


# CancelledError raised by a handler (nobody cancelled it) is a failure, not a shutdown: a job
# handed back as PENDING without consuming a retry would loop, thousands of attempts a minute
# (not terminal after 20 s, with hundreds of attempts).


async def test_a_handler_raising_cancelled_error_consumes_its_retries(
    settings: Settings, db_url: str
) -> None:
    async with running_stack(settings, router, concurrency=2) as stack:
        job = await stack.submit("cancels_itself")
        assert (await wait_for(db_url, [job], timeout=20)) == {uuid.UUID(job): "FAILED"}
        later = await stack.submit("echo")
        await wait_for(db_url, [later], statuses=["COMPLETED"], timeout=20)
    r = await _row(db_url, job)
    assert r["attempts"] == 2, dict(r)  # max_retries=1: two attempts, then FAILED
    assert "CancelledError" in r["last_error"]


# An exception whose __str__ raises still gets an outcome: otherwise the handler's task dies
# without one and the job holds its slot for ever (still IN_PROGRESS after 20 s).


async def test_an_exception_that_cannot_be_printed_is_still_a_failure(
    settings: Settings, db_url: str
) -> None:
    async with running_stack(settings, router, concurrency=2) as stack:
        job = await stack.submit("unprintable_error")
        assert (await wait_for(db_url, [job], timeout=20)) == {uuid.UUID(job): "FAILED"}
    assert "Unprintable" in (await _row(db_url, job))["last_error"]


# Two sync handlers past their timeout must not starve later sync jobs of pool threads (each
# would time out inside the executor's queue without starting: quick_sync FAILED with
# "TimeoutError"). The work past a timeout keeps its slot until it ends, so the stuck jobs stay
# IN_PROGRESS meanwhile and the later ones run on the slot left.


async def test_timed_out_sync_handlers_do_not_starve_later_sync_jobs(
    settings: Settings, db_url: str
) -> None:
    worker_apps.RELEASE_THREADS.clear()
    try:
        async with running_stack(settings, router, concurrency=3) as stack:
            stuck = [await stack.submit("stuck_sync") for _ in range(2)]
            await wait_for(db_url, stuck, ["IN_PROGRESS"], timeout=20)
            quick = [await stack.submit("quick_sync") for _ in range(4)]
            statuses = await wait_for(db_url, quick, timeout=20)
            assert set(statuses.values()) == {"COMPLETED"}, statuses
            await asyncio.sleep(1.0)  # the stuck ones past their 0.5 s timeout
            still = await wait_for(db_url, stuck, ["IN_PROGRESS"], timeout=1)
            assert set(still.values()) == {"IN_PROGRESS"}  # their work goes on: so do their slots
            status = stack.workers[0].status()
            assert status.executor.threads_alive == 2, status.executor
            assert status.executor.threads_abandoned == 0, status.executor
            worker_apps.RELEASE_THREADS.set()
            await wait_for(db_url, stuck, timeout=20)
    finally:
        worker_apps.RELEASE_THREADS.set()
    for job in stuck:
        r = await _row(db_url, job)
        assert "TimeoutError" in (r["last_error"] or ""), dict(r)


# Retry(delay=0) has a floor: a handler raising Retry(0) must not go straight back to its queue,
# a hot loop through the outbox (run_at would be the time of the failure itself).


async def test_retry_with_no_delay_waits_the_floor(settings: Settings, db_url: str) -> None:
    async with running_stack(settings, router, concurrency=2) as stack:
        job = await stack.submit("retry_now")
        await wait_for(db_url, [job], statuses=["RETRYING"], timeout=20)
        r = await _row(db_url, job)
    assert r["wait"].total_seconds() >= 1.0, dict(r)


@pytest.mark.parametrize("job_type", ["nul_result", "cancels_itself", "unprintable_error"])
async def test_the_worker_reports_no_dead_part_after_a_misbehaving_handler(
    settings: Settings, db_url: str, job_type: str
) -> None:
    async with running_stack(settings, router, concurrency=2) as stack:
        job = await stack.submit(job_type)
        await wait_for(db_url, [job], timeout=20)
        status = stack.workers[0].status()
        assert status.dead_parts == [], status
        assert status.executor.running == 0, status.executor
