"""Handlers for the fault tests, importable by a worker subprocess as ``tests.faults.apps:router``
(run from the repository root).

Every handler writes its side effects to a ledger: a file named in the job's payload
(``payload["ledger"]``), one line per event (``start``/``done``/``fail`` job-id attempt pid),
appended with ``O_APPEND`` so several worker processes share it safely and it survives a database
outage. The checker compares the ledger with what PostgreSQL accepted.

Payload knobs: ``sleep`` (seconds per attempt, default 0.05), ``sleep_first`` (seconds for the
first attempt only, e.g. longer than a shutdown grace), ``gate`` (a file: the attempt waits for
it to exist before its sleep, so a test decides when jobs finish) and ``followup`` (a job type:
the attempt enqueues one follow-up of it, so its completion is written in a transaction of two
statements, not one statement alone).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from conveyor import Job, JobRouter

router = JobRouter()


def record(job: Job, what: str) -> None:
    path = job.payload.get("ledger")
    if not path:
        return
    line = f"{what} {job.id} {job.attempt} {os.getpid()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _exists(path: str) -> bool:
    """A microsecond's stat, not worth a thread (as ``record``'s append)."""
    return os.path.exists(path)


def _sleep_for(job: Job) -> float:
    if job.attempt == 1 and "sleep_first" in job.payload:
        return float(job.payload["sleep_first"])
    return float(job.payload.get("sleep", 0.05))


async def _work(job: Job) -> dict[str, Any]:
    record(job, "start")
    gate = job.payload.get("gate")
    while gate and not _exists(gate):
        await asyncio.sleep(0.02)
    await asyncio.sleep(_sleep_for(job))
    if job.payload.get("followup"):
        job.enqueue(job.payload["followup"], {"ledger": job.payload.get("ledger"), "sleep": 0})
    record(job, "done")
    return {"attempt": job.attempt}


@router.job("work", max_retries=25)
async def work(job: Job) -> dict[str, Any]:
    """Sleeps, then completes. Many retries: repeated kills must not exhaust them."""
    return await _work(job)


@router.job("sync_work", max_retries=25)
def sync_work(job: Job) -> dict[str, Any]:
    """A synchronous handler (the worker runs it in its thread pool)."""
    record(job, "start")
    time.sleep(_sleep_for(job))
    record(job, "done")
    return {"attempt": job.attempt}


@router.job("flaky", max_retries=3, retry_delays=[4])
async def flaky(job: Job) -> dict[str, Any]:
    """Fails its first attempt (to the 4 s holding pen), completes afterwards."""
    if job.attempt == 1:
        record(job, "start")
        record(job, "fail")
        raise ConnectionError("flaky: first attempt fails on purpose")
    return await _work(job)


@router.job("doomed", max_retries=2, retry_delays=[1])
async def doomed(job: Job) -> None:
    """Always fails: FAILED after 1 + max_retries attempts, with a dead-letter copy."""
    record(job, "start")
    record(job, "fail")
    raise RuntimeError(f"doomed: attempt {job.attempt} failed on purpose")


@router.job("suicide", max_retries=1)
async def suicide(job: Job) -> None:
    """Kills its own worker process: the lease runs out, the sweeper counts the attempt."""
    record(job, "start")
    os._exit(1)


# A router that knows one more type, for the worker that finally runs misrouted jobs.
ghost_router = JobRouter()
ghost_router.include(router)


@ghost_router.job("ghost", max_retries=3)
async def ghost(job: Job) -> dict[str, Any]:
    return await _work(job)
