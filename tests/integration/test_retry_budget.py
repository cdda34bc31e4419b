"""``retry_count`` counts retries performed and never exceeds ``max_retries`` —
a job FAILED after its retries shows ``retry_count == max_retries``, whether its attempts failed
in the handler or lost their lease."""

from __future__ import annotations

import asyncpg
import pytest

from conveyor import JobSpec, enqueue_many
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import Failure, for_schema
from conveyor.worker import outcomes

store = for_schema()


async def _claim(db: asyncpg.Connection, job_id: object) -> tuple[int, int, int]:
    await db.execute("UPDATE jobs SET run_at = now() WHERE status = 'RETRYING'")  # due now
    [job] = await store.job_claim_many(
        db, [job_id], lease_seconds=5, worker_id="w", types=["t"], handler_defaults={},
        default_max_retries=3,
    )  # fmt: skip
    return job.attempts, job.retry_count, job.max_retries


async def _row(db: asyncpg.Connection, job_id: object) -> tuple[str, int, int]:
    row = await db.fetchrow(
        "SELECT status::text, attempts, retry_count FROM jobs WHERE id = $1", job_id
    )
    return row[0], row[1], row[2]


@pytest.mark.parametrize("max_retries", [0, 2])
async def test_handler_failures_stop_at_max_retries(
    db: asyncpg.Connection, max_retries: int
) -> None:
    [job_id] = await enqueue_many(db, [JobSpec("t", max_retries=max_retries)])
    for _ in range(max_retries + 1):
        attempt, retry_count, budget = await _claim(db, job_id)
        o = outcomes.failed(
            ValueError("boom"), retry_count=retry_count, max_retries=budget, spec=None
        )
        await store.job_fail_many(db, [Failure(job_id, attempt, o.error, o.delay, o.consume)])
    assert await _row(db, job_id) == ("FAILED", max_retries + 1, max_retries)


async def test_a_failure_the_worker_misjudged_still_stops_at_max_retries(
    db: asyncpg.Connection,
) -> None:
    """A stale or buggy writer asking for another retry past the budget: the store says FAILED."""
    [job_id] = await enqueue_many(db, [JobSpec("t", max_retries=1)])
    for _ in range(2):
        attempt, _, _ = await _claim(db, job_id)
        await store.job_fail_many(db, [Failure(job_id, attempt, "boom", 1)])
    assert await _row(db, job_id) == ("FAILED", 2, 1)
    assert await db.fetchval("SELECT destination FROM job_outbox ORDER BY id DESC LIMIT 1") == (
        "dead"
    )


@pytest.mark.parametrize("max_retries", [0, 2])
async def test_lost_leases_stop_at_max_retries(
    db: asyncpg.Connection, sweeper: Sweeper, max_retries: int
) -> None:
    [job_id] = await enqueue_many(db, [JobSpec("t", max_retries=max_retries)])
    for _ in range(max_retries + 1):
        await _claim(db, job_id)
        await db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 s'")
        await sweeper.recover_leases()
    assert await _row(db, job_id) == ("FAILED", max_retries + 1, max_retries)


async def test_lease_expiry_retries_wait_an_exponential_backoff_in_the_pens(
    db: asyncpg.Connection, sweeper: Sweeper
) -> None:
    """A job that crashes its worker must not hit the fleet again at once, every
    lease period: its re-publish goes through a holding pen with the default backoff."""
    [job_id] = await enqueue_many(db, [JobSpec("t", max_retries=5)])
    delays = []
    for _ in range(4):
        await db.execute("DELETE FROM job_outbox")
        await _claim(db, job_id)
        await db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 s'")
        assert await sweeper.recover_leases() == {"RETRYING": 1}
        row = await db.fetchrow("SELECT destination, delay_seconds FROM job_outbox")
        wait = await db.fetchval(
            "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE id = $1", job_id
        )
        assert row["destination"] == "retry", dict(row)
        assert abs(wait - row["delay_seconds"]) < 1.0
        delays.append(row["delay_seconds"])
    assert delays[0] >= 1 and delays == sorted(delays) and delays[3] > delays[0], delays
