"""Handlers that misbehave the way real handlers do, beside well-behaved ones, for the worker's
own tests. Importable by a worker subprocess as
``tests.integration.worker_apps:router`` (run from the repository root)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from conveyor import Job, JobRouter, Retry

router = JobRouter()
# set by a test to let the ``stuck_sync`` threads end
RELEASE_THREADS = threading.Event()


@router.job("echo")
async def echo(job: Job) -> dict[str, Any]:
    return {"echo": job.payload}


@router.job("nul_result", max_retries=0)
async def nul_result(job: Job) -> dict[str, Any]:
    """A result PostgreSQL's jsonb refuses (``\\u0000``)."""
    return {"text": "a\x00b"}


@router.job("nul_error", max_retries=0)
async def nul_error(job: Job) -> None:
    """An error text PostgreSQL's text refuses (NUL)."""
    raise ValueError("bad byte \x00 here")


@router.job("cancels_itself", max_retries=1, retry_delays=[1])
async def cancels_itself(job: Job) -> None:
    """Raises CancelledError though nobody cancelled it (e.g. a library's timeout gone wrong)."""
    raise asyncio.CancelledError("not a shutdown")


@router.job("exits", max_retries=0)
async def exits(job: Job) -> None:
    raise SystemExit(3)


@router.job("interrupts", max_retries=0)
async def interrupts(job: Job) -> None:
    raise KeyboardInterrupt


@router.job("generator_exit", max_retries=0)
async def generator_exit(job: Job) -> None:
    raise GeneratorExit


@router.job("sync_exits", max_retries=0)
def sync_exits(job: Job) -> None:
    raise SystemExit(4)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ raises too")


@router.job("unprintable_error", max_retries=0)
async def unprintable_error(job: Job) -> None:
    raise Unprintable()


@router.job("stuck_sync", timeout=0.5, max_retries=0)
def stuck_sync(job: Job) -> None:
    """Outlives its timeout by far (until the test releases it, at most 60 s)."""
    RELEASE_THREADS.wait(float(job.payload.get("seconds", 60)))


@router.job("quick_sync", timeout=2)
def quick_sync(job: Job) -> str:
    return threading.current_thread().name


@router.job("retry_now", max_retries=0)
async def retry_now(job: Job) -> None:
    raise Retry(delay=0, reason="again, at once")


@router.job("blocks_loop", max_retries=0)
async def blocks_loop(job: Job) -> str:
    """An ``async def`` that blocks the event loop (a sync client call in an async handler)."""
    time.sleep(float(job.payload.get("seconds", 3)))
    return "unblocked"


@router.job("blocks_loop_timeout", max_retries=0, timeout=1)
async def blocks_loop_timeout(job: Job) -> str:
    """The same with a timeout: the worker's loop guard preempts it (``worker/guard.py``)."""
    time.sleep(float(job.payload.get("seconds", 8)))
    return "unblocked"


@router.job("slow", max_retries=2)
async def slow(job: Job) -> str:
    await asyncio.sleep(float(job.payload.get("seconds", 1)))
    return "done"
