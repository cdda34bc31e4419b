"""A concurrency-limited type drains a backlog at its limit: a finished job's slot is admitted
to the next job at once (``maintenance/admission.py``), and only admitted jobs reach the broker,
so no job waits in a holding pen or a worker's hand for a slot: the drain takes at most three
times its ideal time (jobs x seconds / limit)."""

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
        assert attempts == 1  # nothing was claimed and turned back
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
