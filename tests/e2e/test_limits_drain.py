"""A concurrency-limited type drains a backlog at its limit: a job held for a full limit waits
in the worker's hand for a slot (claimed again when one of the worker's jobs finishes, or after a
short backoff for a slot freed elsewhere), not in a holding pen for up to 10 s.

Before: held jobs all came back from the same pen together, two ran, the rest went back
(60 jobs of 0.2 s at concurrency 2 took 212 s on one worker instead of 6 s)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from conveyor.core.config import Settings

from ..stack import running_stack, wait_for
from .gray_limits_app import router

SECONDS = 0.2
LIMIT = 2


async def _drain(settings: Settings, db: asyncpg.Connection, workers: int, n: int) -> float:
    # the API fails fast (503 after CONVEYOR_DB_TIMEOUT, 1.5 s) by design; this test measures
    # the drain, and submits in one burst beside other tests on two cores
    settings = settings.model_copy(update={"db_timeout": 10.0})
    async with running_stack(settings, router, workers=workers, concurrency=4) as stack:
        t0 = time.monotonic()
        ids = await asyncio.gather(
            *(stack.submit("g_pair", {"seconds": SECONDS}) for _ in range(n))
        )
        ideal = n * SECONDS / LIMIT
        try:
            await wait_for(settings.database_url, ids, ["COMPLETED"], timeout=3 * ideal)
        finally:
            took = time.monotonic() - t0
            done = await db.fetchval(
                "SELECT count(*) FROM jobs WHERE job_type = 'g_pair' AND status = 'COMPLETED'"
            )
            ratio = took / ideal
            print(f"\ndrain: {workers} worker(s), {done}/{n} jobs of {SECONDS} s at concurrency "
                  f"{LIMIT} in {took:.1f} s (ideal {ideal:.1f} s, ratio {ratio:.2f})")  # fmt: skip
        attempts = await db.fetchval("SELECT max(attempts) FROM jobs WHERE job_type = 'g_pair'")
        assert attempts == 1  # held jobs consumed no attempt
        return took / ideal


@pytest.mark.serial
@pytest.mark.timeout(120)
async def test_one_worker_drains_a_limited_backlog_at_its_limit(
    settings: Settings, db: asyncpg.Connection
) -> None:
    assert await _drain(settings, db, 1, 60) < 3


@pytest.mark.serial
@pytest.mark.timeout(120)
async def test_three_workers_drain_a_limited_backlog_at_its_limit(
    settings: Settings, db: asyncpg.Connection
) -> None:
    assert await _drain(settings, db, 3, 100) < 3


@pytest.mark.timeout(120)
async def test_a_draining_worker_hands_back_the_jobs_in_its_hand(
    settings: Settings, db: asyncpg.Connection
) -> None:
    # jobs held in hand were acknowledged when they were held: the drain gives them back through
    # the shortest pen (hold dropped), and another worker runs them
    async with running_stack(settings, router, workers=1, concurrency=4) as stack:
        ids = [await stack.submit("g_pair", {"seconds": 1.0}) for _ in range(6)]
        consumer = stack.workers[0].consumer
        for _ in range(200):
            if sum(len(w) for w in consumer.waiting.values()) >= 2:
                break
            await asyncio.sleep(0.05)
        in_hand = [i for w in consumer.waiting.values() for i in w]
        assert len(in_hand) >= 2
        await stack.workers.pop().stop(grace=5)
        rows = await db.fetch("SELECT status::text AS s, lease_expires_at FROM jobs "
                              "WHERE id = ANY($1)", in_hand)  # fmt: skip
        assert {(r["s"], r["lease_expires_at"]) for r in rows} == {("PENDING", None)}
        await stack.add_worker(router, concurrency=4)
        await wait_for(settings.database_url, ids, ["COMPLETED"], timeout=60)
    assert await db.fetchval("SELECT max(attempts) FROM jobs WHERE job_type = 'g_pair'") == 1


@pytest.mark.timeout(120)
async def test_a_worker_of_concurrency_one_runs_the_jobs_in_its_hand(
    settings: Settings, db: asyncpg.Connection
) -> None:
    # the consumer's step takes no slot before a delivery arrives: otherwise a worker with one
    # slot, its hand full (its type's queue not consumed), sits on that slot waiting for a
    # delivery that cannot come, and the jobs in its hand never run
    async with running_stack(settings, None) as stack:
        one = await stack.add_worker(router, concurrency=1)
        # another claimer fills the type's two slots
        busy = [r["id"] for r in await db.fetch(
            "INSERT INTO jobs (id, job_type, status, priority, payload, attempts, "
            "lease_expires_at) SELECT gen_random_uuid(), 'g_pair', 'IN_PROGRESS', 5, '{}', 1, "
            "now() + interval '1 hour' FROM generate_series(1, 2) RETURNING id")]  # fmt: skip
        ids = [await stack.submit("g_pair", {"seconds": SECONDS}) for _ in range(6)]
        for _ in range(400):
            if "g_pair" in one.consumer.full:
                break
            await asyncio.sleep(0.05)
        assert "g_pair" in one.consumer.full  # four in hand, its queue no longer consumed
        await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = ANY($1)", busy)
        await wait_for(settings.database_url, ids, ["COMPLETED"], timeout=30)
