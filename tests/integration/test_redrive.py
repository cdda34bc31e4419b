"""The store's half of redrives: a redrive of a cancelled scheduled job keeps its
``run_at``; a dead letter's redrive is fenced by the attempt it recorded, so it cannot revive a
job that was redriven (and then cancelled, or failed again) since."""

from __future__ import annotations

import datetime as dt

import asyncpg

from conveyor import JobSpec, enqueue_many
from conveyor.store import Attempt, Failure, for_schema

store = for_schema()


async def _fail(db: asyncpg.Connection, job_id: object) -> int:
    [job] = await store.job_claim_many(
        db, [job_id], lease_seconds=5, worker_id="w", types=["t"], handler_defaults={},
        default_max_retries=0,
    )  # fmt: skip
    await store.job_fail_many(db, [Failure(job.id, job.attempts, "boom", None)])
    return job.attempts


async def test_redrive_of_a_cancelled_scheduled_job_keeps_its_run_at(
    db: asyncpg.Connection,
) -> None:
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    [job_id] = await enqueue_many(db, [JobSpec("t", run_at=run_at)])
    assert await store.job_cancel(db, job_id)
    await db.execute("DELETE FROM job_outbox")
    assert await store.job_redrive(db, [job_id]) == [job_id]
    row = await db.fetchrow("SELECT status::text, run_at FROM jobs WHERE id = $1", job_id)
    assert (row["status"], row["run_at"]) == ("SCHEDULED", run_at)
    assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0  # promoted at run_at


async def test_redrive_of_a_cancelled_due_job_is_pending_now(db: asyncpg.Connection) -> None:
    [job_id] = await enqueue_many(db, [JobSpec("t")])
    assert await store.job_cancel(db, job_id)
    await db.execute("DELETE FROM job_outbox")
    assert await store.job_redrive(db, [job_id]) == [job_id]
    assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", job_id) == "PENDING"
    assert await db.fetchval("SELECT job_id FROM job_outbox") == job_id


async def test_dead_letters_carry_the_attempt_they_recorded(db: asyncpg.Connection) -> None:
    [job_id] = await enqueue_many(db, [JobSpec("t")])
    await db.execute("DELETE FROM job_outbox")
    attempt = await _fail(db, job_id)
    [row] = await store.outbox_take_batch(db, limit=10)
    assert (row.destination, row.attempt) == ("dead", attempt)


async def test_fenced_redrive_only_revives_the_failure_its_dead_letter_recorded(
    db: asyncpg.Connection,
) -> None:
    a, b, c = await enqueue_many(db, [JobSpec("t"), JobSpec("t"), JobSpec("t")])
    letters = {j: await _fail(db, j) for j in (a, b, c)}
    # a: redriven through the API, then cancelled before it ran again
    assert await store.job_redrive(db, [a]) == [a]
    assert await store.job_cancel(db, a)
    # b: redriven through the API and failed again (a newer dead letter exists)
    assert await store.job_redrive(db, [b]) == [b]
    newer = await _fail(db, b)
    # c: untouched since its dead letter
    await db.execute("DELETE FROM job_outbox")
    redriven = await store.job_redrive_failed(db, [Attempt(j, n) for j, n in letters.items()])
    assert redriven == [c]
    assert await store.job_redrive_failed(db, [Attempt(b, newer)]) == [b]
    statuses = dict(await db.fetch("SELECT id, status::text FROM jobs"))
    assert statuses == {a: "CANCELLED", b: "PENDING", c: "PENDING"}
    assert sorted(await db.fetch("SELECT job_id FROM job_outbox")) == sorted([(b,), (c,)])
