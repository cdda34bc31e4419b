"""Handlers for the gray-failure tests of type limits (``test_limits_drain``,
``tests/faults/test_frozen_claim``): a type limited to two jobs at a time fleet-wide."""

from __future__ import annotations

import asyncio

from conveyor import Job, JobRouter

router = JobRouter()


@router.job("g_pair", concurrency=2, timeout=60)
async def pair_job(job: Job) -> None:
    await asyncio.sleep(float(job.payload.get("seconds", 0.2)))
