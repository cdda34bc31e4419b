"""The job features in one router: `conveyor dev --app examples.features:router`.

- middleware (``timing``) around every handler call;
- progress (``import_rows`` reports it; ``GET /jobs/{id}`` shows it while it runs);
- follow-up jobs (``import_rows`` enqueues ``notify`` with its completion);
- fleet-wide limits (``call_partner_api``: 2 at a time, 30 starts a minute, across all workers);
- weights (``import_rows`` gets 3 shares of a worker's slots for each one of ``notify``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from conveyor import CallNext, Job, JobRouter

router = JobRouter()
log = logging.getLogger("examples.features")


@router.middleware
async def timing(job: Job, call_next: CallNext) -> Any:
    """Runs around every handler (async and sync); what it raises fails the attempt."""
    started = time.monotonic()
    try:
        return await call_next(job)
    finally:
        log.info("job %s %s took %.3f s", job.type, job.id, time.monotonic() - started)


@router.job("import_rows", timeout=120, weight=3)
async def import_rows(job: Job) -> dict[str, int]:
    rows = int(job.payload.get("rows", 50))
    for i in range(rows):
        await asyncio.sleep(0.1)  # the work
        await job.set_progress(100 * (i + 1) / rows, f"{i + 1} of {rows} rows")
    # committed with this job's COMPLETED transition, and only if it completes
    await job.enqueue("notify", {"text": f"imported {rows} rows"}, priority="high")
    return {"rows": rows}


@router.job("notify")
def notify(job: Job) -> str:  # sync handlers get the same middleware, progress and enqueue
    job.set_progress(100, "sent")
    return str(job.payload["text"])


@router.job("call_partner_api", concurrency=2, rate_limit="30/m", timeout=30)
async def call_partner_api(job: Job) -> str:
    await asyncio.sleep(1)
    return "ok"
