"""Handlers used by the integration and end-to-end tests. Every run is recorded in ``RUNS`` so a
test can count executions per job."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

from conveyor import Job, JobRouter, Retry

RUNS: collections.Counter[str] = collections.Counter()
ORDER: list[str] = []
_lock = threading.Lock()


def record(job: Job) -> None:
    with _lock:
        RUNS[str(job.id)] += 1
        ORDER.append(str(job.id))


def reset() -> None:
    with _lock:
        RUNS.clear()
        ORDER.clear()


router = JobRouter()


@router.job("noop")
async def noop(job: Job) -> None:
    record(job)


@router.job("echo")
async def echo(job: Job) -> dict[str, Any]:
    record(job)
    return {"echo": job.payload, "attempt": job.attempt, "priority": job.priority}


@router.job("sync_echo")
def sync_echo(job: Job) -> dict[str, Any]:
    record(job)
    return {"thread": threading.current_thread().name.startswith("conveyor-handler")}


@router.job("flaky", retry_delays=[1])
async def flaky(job: Job) -> str:
    """Fails until its ``succeed_on`` attempt."""
    record(job)
    if job.attempt < job.payload.get("succeed_on", 2):
        raise ConnectionError(f"boom on attempt {job.attempt}")
    return "ok"


@router.job("always_fails", max_retries=2, retry_delays=[1])
async def always_fails(job: Job) -> None:
    record(job)
    raise ValueError(f"always fails (attempt {job.attempt})")


@router.job("snooze", max_retries=0)
async def snooze(job: Job) -> int:
    record(job)
    if job.attempt < 3:
        raise Retry(delay=1, reason="not yet")
    return job.attempt


@router.job("slow", timeout=30)
async def slow(job: Job) -> str:
    record(job)
    seconds = float(job.payload.get("seconds", 1))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if job.payload.get("observe_cancel") and job.cancel_requested:
            return "stopped early"
        await asyncio.sleep(0.05)
    return "done"


@router.job("sleepy_async", timeout=0.5, max_retries=0)
async def sleepy_async(job: Job) -> None:
    record(job)
    await asyncio.sleep(10)


@router.job("sleepy_sync", timeout=0.5, max_retries=0)
def sleepy_sync(job: Job) -> None:
    record(job)
    time.sleep(2)


@router.job("retry_later", retry_delays=[30])
async def retry_later(job: Job) -> None:
    record(job)
    raise ConnectionError("try again in 30 s")
