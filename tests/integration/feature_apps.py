"""Handlers of the job-feature tests (progress, follow-ups, middleware, limits, weights)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from conveyor import CallNext, Job, JobRouter
from conveyor.core.errors import UnknownJobType

router = JobRouter()
SEEN: list[str] = []  # what the middleware saw, in order
GATE = threading.Event()  # progress handlers wait on it


@router.middleware
async def tenancy(job: Job, call_next: CallNext) -> Any:
    SEEN.append(f"{job.type}:{job.attempt}")
    result = await call_next(job)
    return {"wrapped": result} if job.payload.get("wrap") else result


@router.job("f_progress_async", timeout=20)
async def progress_async(job: Job) -> str:
    await job.set_progress(10)
    await job.set_progress(50, "half way")
    while not GATE.is_set():
        await asyncio.sleep(0.02)
    return "done"


@router.job("f_progress_sync", timeout=20)
def progress_sync(job: Job) -> str:
    job.set_progress(75, "from a thread")
    GATE.wait(20)
    return "done"


@router.job("f_chatty", timeout=20)
async def chatty(job: Job) -> int:
    """Reports progress every 5 ms for ``seconds``."""
    n, deadline = 0, time.monotonic() + float(job.payload["seconds"])
    while time.monotonic() < deadline:
        n += 1
        await job.set_progress(min(100, n / 10), f"step {n}")
        await asyncio.sleep(0.005)
    return n


@router.job("f_parent", max_retries=0, timeout=20)
async def parent(job: Job) -> dict[str, Any]:
    ids = [str(await job.enqueue("f_child", {"i": i, "of": str(job.id)})) for i in range(2)]
    sync_id = job.enqueue("f_child", {"i": 2, "of": str(job.id)}, priority="high")
    ids.append(str(sync_id))
    try:
        job.enqueue("no_such_type", {})
        refused = False
    except UnknownJobType:
        refused = True
    if job.payload.get("fail"):
        raise RuntimeError("the parent fails after enqueueing")
    if job.payload.get("wait_cancel"):
        await asyncio.wait_for(job.wait_cancelled(), 20)
    return {"children": ids, "unknown_refused": refused}


@router.job("f_sync_parent", max_retries=0, timeout=20)
def sync_parent(job: Job) -> str:
    return str(job.enqueue("f_child", {"i": 0, "of": str(job.id)}))


@router.job("f_child")
async def child(job: Job) -> dict[str, Any]:
    return {"child_of": job.payload["of"]}


@router.job("f_pausable")
async def pausable(job: Job) -> int:
    return job.attempt


@router.job("f_single", concurrency=1)
async def single(job: Job) -> None:
    await asyncio.sleep(0.2)


limited = JobRouter()  # run in worker processes by test_type_limits (3 of them)


@limited.job("f_limited", concurrency=3, timeout=30)
async def limited_job(job: Job) -> None:
    await asyncio.sleep(float(job.payload.get("seconds", 0.3)))


@limited.job("f_rated", rate_limit="10/2s", timeout=30)
async def rated_job(job: Job) -> None:
    return None


@limited.job("f_free", timeout=30)
async def free_job(job: Job) -> None:
    await asyncio.sleep(float(job.payload.get("seconds", 0.3)))


weighted = JobRouter()


@weighted.job("f_heavy", weight=3)
async def heavy(job: Job) -> None:
    await asyncio.sleep(0.1)


@weighted.job("f_light")
async def light(job: Job) -> None:
    await asyncio.sleep(0.1)
