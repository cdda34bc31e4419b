"""A worker whose hand of a limited type is full stops consuming the type's queue, and consumes
it again once half of the hand has run. If the broker is down at that moment (a connection
closed by a restart or a partition), the switch fails: it is tried again until it takes.

Before: the failed resume was logged (``hand_switch_failed``) and never tried again, so the
worker never consumed the type again until it restarted. In the gray nemesis soak both workers
lost ``sync_work`` that way after broker restarts and forced closes: its queue grew to 109 ready
messages nobody consumed and 239 of its jobs took over 60 s (worst 239 s) from submit to finish.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest

from conveyor.core.config import Settings

from ..stack import running_stack, wait_for
from .gray_limits_app import router


@pytest.mark.timeout(90)
async def test_a_failed_resume_of_a_full_hand_is_tried_again(
    settings: Settings, db: asyncpg.Connection
) -> None:
    async with running_stack(settings, None) as stack:
        one = await stack.add_worker(router, concurrency=4)
        consumer = one.consumer
        switch = consumer.controls.on_pause
        failed: list[tuple[str, bool]] = []

        async def broker_down_once(job_type: str, paused: bool) -> None:
            # the first resume meets a closed channel, as after a broker restart
            if not paused and not failed:
                failed.append((job_type, paused))
                raise ConnectionError("channel closed")
            await switch(job_type, paused)

        consumer.controls.on_pause = broker_down_once
        # another claimer fills the type's two slots
        busy = [r["id"] for r in await db.fetch(
            "INSERT INTO jobs (id, job_type, status, priority, payload, attempts, "
            "lease_expires_at) SELECT gen_random_uuid(), 'g_pair', 'IN_PROGRESS', 5, '{}', 1, "
            "now() + interval '1 hour' FROM generate_series(1, 2) RETURNING id")]  # fmt: skip
        first = [await stack.submit("g_pair", {"seconds": 0.05}) for _ in range(6)]
        for _ in range(400):
            if "g_pair" in consumer.full:
                break
            await asyncio.sleep(0.05)
        assert "g_pair" in consumer.full  # four in hand, its queue no longer consumed
        await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = ANY($1)", busy)
        await wait_for(settings.database_url, first, ["COMPLETED"], timeout=30)
        assert failed == [("g_pair", False)]
        # the queue is consumed again: jobs submitted now run
        later = [await stack.submit("g_pair", {"seconds": 0.05}) for _ in range(3)]
        await wait_for(settings.database_url, later, ["COMPLETED"], timeout=15)


@pytest.mark.timeout(90)
async def test_a_failed_resume_of_an_operators_pause_is_tried_again(
    settings: Settings, db: asyncpg.Connection
) -> None:
    # the same for an operator's pause: the refresh that meets a closed channel on resume
    # leaves the type a change still to make, and the next refresh makes it
    async with running_stack(settings, None) as stack:
        one = await stack.add_worker(router, concurrency=4)
        switch = one.controls.on_pause
        failed: list[tuple[str, bool]] = []

        async def broker_down_once(job_type: str, paused: bool) -> None:
            if not paused and not failed:
                failed.append((job_type, paused))
                raise ConnectionError("channel closed")
            await switch(job_type, paused)

        one.controls.on_pause = broker_down_once
        await db.execute("UPDATE job_types SET paused = true WHERE name = 'g_pair'")
        await one.controls.refresh_once()
        assert "g_pair" in one.controls.paused
        ids = [await stack.submit("g_pair", {"seconds": 0.05}) for _ in range(3)]
        await db.execute("UPDATE job_types SET paused = false WHERE name = 'g_pair'")
        for _ in range(2):  # the first resume fails (here or in the worker's own loop)
            with contextlib.suppress(ConnectionError):
                await one.controls.refresh_once()
        assert failed == [("g_pair", False)]
        await wait_for(settings.database_url, ids, ["COMPLETED"], timeout=15)
