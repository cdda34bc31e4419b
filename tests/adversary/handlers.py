"""Handlers that misbehave the way real handlers do, beside well-behaved neighbours. A worker
subprocess imports them as ``tests.adversary.handlers:router`` (run from the repository root).

Each misbehaving type has ``max_retries=1`` and ``retry_delays=[1]`` (a short, bounded life) and,
where it needs one, a short ``timeout``; ``budget()`` turns that into the seconds within which a
job of the type must be terminal. Payload knob for the neighbours: ``sleep`` (seconds).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from conveyor import Job, JobRouter

router = JobRouter()

RETRIES = {"max_retries": 1, "retry_delays": [1]}


# --------------------------------------------------------------------------- the neighbours


@router.job("neighbour")
async def neighbour(job: Job) -> dict[str, Any]:
    await asyncio.sleep(float(job.payload.get("sleep", 0.2)))
    return {"ok": job.attempt}


@router.job("neighbour_sync")
def neighbour_sync(job: Job) -> dict[str, Any]:
    time.sleep(float(job.payload.get("sleep", 0.2)))
    return {"ok": job.attempt}


# --------------------------------------------------------------------------- the adversaries


@router.job("nul_result", **RETRIES)
async def nul_result(job: Job) -> dict[str, str]:
    """PostgreSQL's jsonb refuses ``\\u0000``."""
    return {"text": "a\x00b"}


@router.job("nul_error", **RETRIES)
async def nul_error(job: Job) -> None:
    """PostgreSQL's text refuses NUL bytes."""
    raise ValueError("bad byte \x00 in the input")


@router.job("not_json", **RETRIES)
async def not_json(job: Job) -> object:
    return {"when": object()}


@router.job("huge_result", **RETRIES, timeout=20)
async def huge_result(job: Job) -> dict[str, str]:
    await asyncio.sleep(0.3)  # written while the neighbours measured after its start run
    return {"blob": "x" * (10 * 1024 * 1024)}


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of this exception raises")


@router.job("bad_str", **RETRIES)
async def bad_str(job: Job) -> None:
    raise Unprintable()


@router.job("cancelled", **RETRIES)
async def cancelled(job: Job) -> None:
    """Not a shutdown: the handler's own code raises ``CancelledError`` (a cancelled inner
    task, a library's timeout)."""
    raise asyncio.CancelledError()


@router.job("system_exit", **RETRIES)
async def system_exit(job: Job) -> None:
    raise SystemExit(3)


@router.job("os_exit", **RETRIES)
async def os_exit(job: Job) -> None:
    """Kills its worker process: the lease runs out, the sweeper counts the attempt."""
    os._exit(7)


@router.job("endless_sync", **RETRIES, timeout=1)
def endless_sync(job: Job) -> None:
    """Never returns and never looks at ``cancel_requested`` (keeps its thread forever)."""
    while True:
        time.sleep(0.2)


@router.job("blocks_loop", **RETRIES, timeout=1)
async def blocks_loop(job: Job) -> None:
    """An ``async def`` that calls blocking code: the worker's event loop stops (heartbeats
    too) for 4 s, longer than the visibility timeout, unless the worker's loop guard preempts
    it at its 1 s timeout (``LoopBlocked``)."""
    time.sleep(float(job.payload.get("block", 4)))


@router.job("times_out", **RETRIES, timeout=0.5)
async def times_out(job: Job) -> None:
    await asyncio.sleep(60)


ADVERSARIES = [t for t in router.types if not t.startswith("neighbour")]


def budget(job_type: str, *, visibility_timeout: float, restart: float = 0.0) -> float:
    """Seconds within which a job of ``job_type`` must be terminal: each attempt may run to its
    timeout or until its lease expires (plus a worker restart when it kills its process), and
    waits its retry delay before the next one; plus 5 s for the relay, the sweeper's period and
    the machine's load."""
    spec = router.handlers[job_type]
    attempts = (spec.max_retries or 0) + 1
    per_attempt = max(spec.timeout or 0.0, visibility_timeout) + visibility_timeout + restart
    delays = sum((spec.retry_delays or (0,))[: attempts - 1])
    return attempts * per_attempt + delays + 5.0
