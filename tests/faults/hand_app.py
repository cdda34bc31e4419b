"""Handlers for ``test_frozen_hand``: a type limited to two jobs at a time fleet-wide, each run
recorded in the ledger named by the payload (``apps.record``), so a second run shows."""

from __future__ import annotations

import asyncio

from conveyor import Job, JobRouter

from .apps import record

router = JobRouter()


@router.job("h_pair", concurrency=2, timeout=60)
async def pair_job(job: Job) -> None:
    record(job, "start")
    await asyncio.sleep(float(job.payload.get("seconds", 0.1)))
    record(job, "done")
