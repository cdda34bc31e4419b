"""A worker stops consuming a paused type's queue and consumes it again on resume. If the broker
is down at that moment (a connection closed by a restart or a partition), the switch fails: it
is tried again until it takes.

Before: a failed resume was logged and never tried again, so the worker never consumed the type
again until it restarted (the gray nemesis soak: a queue of 109 ready messages nobody consumed).
"""

from __future__ import annotations

import contextlib

import asyncpg
import pytest

from conveyor.core.config import Settings

from ..stack import running_stack, wait_for
from .gray_limits_app import router


@pytest.mark.timeout(90)
async def test_a_failed_resume_of_an_operators_pause_is_tried_again(
    settings: Settings, db: asyncpg.Connection
) -> None:
    # the refresh that meets a closed channel on resume leaves the type a change still to
    # make, and the next refresh makes it
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
