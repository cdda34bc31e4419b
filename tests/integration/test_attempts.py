"""Attempt history: one row per attempt, written by the statements that finish it (complete,
fail, release, lease recovery), the running attempt read from its job, pruned with the job.
Time is the database's: the tests move it by rewriting timestamps."""

from __future__ import annotations

import uuid

import asyncpg

from conveyor import JobSpec, enqueue_many
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import Attempt, ClaimedJob, Completion, Failure, for_schema

store = for_schema()


async def _claim(db: asyncpg.Connection, job_id: uuid.UUID, worker: str) -> ClaimedJob:
    [claimed] = await store.job_claim_many(
        db, [job_id], lease_seconds=5.0, worker_id=worker, types=["t"], handler_defaults={},
        default_max_retries=3,
    )  # fmt: skip
    return claimed


async def test_every_kind_of_finish_leaves_one_attempt_row(
    db: asyncpg.Connection, sweeper: Sweeper
) -> None:
    [job_id] = await enqueue_many(db, [JobSpec("t")])
    assert await store.job_attempt_list(db, job_id) == []
    assert await store.job_attempt_list(db, uuid.uuid4()) is None

    a1 = await _claim(db, job_id, "w1")
    [running] = await store.job_attempt_list(db, job_id)  # type: ignore[misc]
    assert (running.attempt, running.worker_id, running.outcome) == (1, "w1", None)
    assert running.finished_at is None and running.started_at is not None
    await store.job_fail_many(db, [Failure(job_id, a1.attempts, "ConnectionError: boom", 0)])

    a2 = await _claim(db, job_id, "w2")
    await store.job_release_many(db, [Attempt(job_id, a2.attempts)])

    a3 = await _claim(db, job_id, "w3")
    await db.execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 s', "
        "started_at = now() - interval '10 s' WHERE id = $1",
        job_id,
    )
    await sweeper.recover_leases()
    finished = sweeper.metrics.registry.get_sample_value(
        "conveyor_jobs_finished_total", {"type": "t", "outcome": "lease_expired"}
    )
    assert finished == 1

    await db.execute("UPDATE jobs SET run_at = now() - interval '4 s' WHERE id = $1", job_id)
    a4 = await _claim(db, job_id, "w4")
    assert a4.wait_seconds >= 4
    assert await store.job_complete_many(db, [Completion(job_id, a4.attempts, '"ok"')])
    # a stale write of a finished attempt is fenced and records nothing
    assert not await store.job_complete_many(db, [Completion(job_id, a3.attempts, '"late"')])

    attempts = await store.job_attempt_list(db, job_id)
    assert attempts is not None
    assert [(a.attempt, a.worker_id, a.outcome) for a in attempts] == [
        (1, "w1", "retry"), (2, "w2", "released"), (3, "w3", "lease_expired"),
        (4, "w4", "completed"),
    ]  # fmt: skip
    assert attempts[0].error == "ConnectionError: boom"
    assert attempts[2].error is not None and "lease expired: worker w3" in attempts[2].error
    assert attempts[2].duration_seconds is not None and attempts[2].duration_seconds >= 10
    assert all(a.finished_at is not None for a in attempts)
    wait = await db.fetchval(
        "SELECT wait_seconds FROM job_attempts WHERE job_id = $1 AND attempt = 4", job_id
    )
    assert wait >= 4


async def test_exhausted_and_cancelled_attempts(db: asyncpg.Connection) -> None:
    failing, cancelled = await enqueue_many(db, [JobSpec("t"), JobSpec("t")])
    a = await _claim(db, failing, "w1")
    await store.job_fail_many(db, [Failure(failing, a.attempts, "ValueError: bad", None)])
    b = await _claim(db, cancelled, "w1")
    assert await store.job_cancel(db, cancelled)
    await store.job_complete_many(db, [Completion(cancelled, b.attempts, "1")])
    fa = await store.job_attempt_list(db, failing)
    ca = await store.job_attempt_list(db, cancelled)
    assert fa is not None and [(x.outcome, x.error) for x in fa] == [("failed", "ValueError: bad")]
    assert ca is not None and [x.outcome for x in ca] == ["cancelled"]


async def test_retention_prunes_the_attempts_with_the_job(
    db: asyncpg.Connection, sweeper: Sweeper
) -> None:
    old, kept = await enqueue_many(db, [JobSpec("t"), JobSpec("t")])
    for job_id in (old, kept):
        c = await _claim(db, job_id, "w1")
        await store.job_complete_many(db, [Completion(job_id, c.attempts, None)])
    await db.execute("UPDATE jobs SET finished_at = now() - interval '30 days' WHERE id = $1", old)
    assert await sweeper.delete_expired() == 1
    rows = await db.fetch("SELECT job_id FROM job_attempts")
    assert [r["job_id"] for r in rows] == [kept]


async def test_dead_letter_purge_by_filter_takes_the_attempts_too(db: asyncpg.Connection) -> None:
    jobs = await enqueue_many(db, [JobSpec("t")] * 3)
    errors = ["ValueError: a\nTraceback…", "ValueError: a", "KeyError: b"]
    for job_id, error in zip(jobs, errors, strict=True):
        c = await _claim(db, job_id, "w1")
        await store.job_fail_many(db, [Failure(job_id, c.attempts, error, None)])
    groups = await store.job_dead_groups(db)
    assert [(g["error"], g["count"]) for g in groups] == [("ValueError: a", 2), ("KeyError: b", 1)]
    assert await store.job_dead_count(db, "t", "ValueError: a") == 2
    assert await store.job_purge_dead(db, "t", "ValueError: a", limit=100) == 2
    left = await db.fetch("SELECT DISTINCT job_id FROM job_attempts")
    assert [r["job_id"] for r in left] == [jobs[2]]
    outbox = "SELECT count(*) FROM job_outbox WHERE job_id = $1"
    before = await db.fetchval(outbox, jobs[2])
    assert await store.job_redrive_dead(db, "t", None, limit=100) == 1
    assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", jobs[2]) == "PENDING"
    assert await db.fetchval(outbox, jobs[2]) == before + 1


# A worker encodes its handler defaults to JSON once (``HandlerDefaults``), not at every claim:
# the claim calls no orjson.


async def test_a_claim_takes_the_handler_defaults_encoded_once(
    db: asyncpg.Connection, monkeypatch: object
) -> None:
    import pytest

    from conveyor.store import attempts
    from conveyor.worker.consumer import Consumer

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    consumer = Consumer(
        None, store, None, slots=None, acks=None, start=None, worker_id="w",  # type: ignore[arg-type]
        types=["t"], handler_defaults={"t": {"max_retries": 7, "timeout": 2.5}},
        visibility_timeout=5, default_max_retries=3,
    )  # fmt: skip

    def no_encoding(*args: object, **kw: object) -> bytes:
        raise AssertionError("the claim encoded the handler defaults again")

    a, b = await enqueue_many(db, [JobSpec("t"), JobSpec("t")])
    monkeypatch.setattr(attempts.orjson, "dumps", no_encoding)  # orjson's, for this test
    claimed = []
    for job_id in (a, b):  # two claims, no encoding
        claimed += await store.job_claim_many(
            db, [job_id], lease_seconds=5.0, worker_id="w", types=["t"],
            handler_defaults=consumer.handler_defaults, default_max_retries=3,
        )  # fmt: skip
    assert [(c.max_retries, c.timeout_seconds) for c in claimed] == [(7, 2.5), (7, 2.5)]
