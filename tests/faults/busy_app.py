"""Handlers that keep a worker busy for ``test_frozen_deliveries``' price check, each recording
its runs in the ledger named by the payload (``apps.record``): ``spin`` computes in its thread
(a sync handler), ``crunch`` computes on the event loop in slices of 0.1 s between awaits, and
``blocker`` blocks the event loop until the loop guard preempts it (after 0.5 s by default)."""

from __future__ import annotations

import asyncio
import time

from conveyor import Job, JobRouter

from .apps import record

router = JobRouter()


def _compute(seconds: float) -> int:
    """Pure Python arithmetic for ``seconds`` (it holds the GIL but between bytecodes)."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        n += sum(i * i for i in range(1000))
    return n


@router.job("spin", timeout=60)
def spin(job: Job) -> None:
    record(job, "start")
    _compute(float(job.payload["seconds"]))
    record(job, "done")


@router.job("crunch", timeout=60)
async def crunch(job: Job) -> None:
    record(job, "start")
    end = time.monotonic() + float(job.payload["seconds"])
    while time.monotonic() < end:
        _compute(0.1)
        await asyncio.sleep(0)
    record(job, "done")


@router.job("blocker", max_retries=0, timeout=60)
async def blocker(job: Job) -> None:
    record(job, "start")
    time.sleep(float(job.payload["seconds"]))  # blocks the event loop: its point
    record(job, "done")
