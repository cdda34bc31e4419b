"""Handlers whose work outlives their timeout, beside the well-behaved neighbours. A worker
subprocess imports them as ``tests.adversary.overrun:router`` (run from the repository root).

Payload knobs: ``log`` (a file each body appends ``start``/``end`` lines to, with
``time.time()``, so a test counts the bodies running at once from the handlers' own records),
``release`` (a file whose existence ends a stuck body early), ``pidfile`` (where a forked child
writes its pid), ``seconds`` (how long a body runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from typing import Any

from conveyor import Job, JobRouter

from . import handlers

router = JobRouter()
router.job("neighbour")(handlers.neighbour)
router.job("neighbour_sync")(handlers.neighbour_sync)
router.job("huge_result", max_retries=1, retry_delays=[1], timeout=20)(handlers.huge_result)
router.job("blocks_loop", max_retries=1, retry_delays=[1], timeout=1)(handlers.blocks_loop)


# a timeout long enough for four of them at a time beside CPU hogs (about 12 s each there)
@router.job("cpu_bursts", max_retries=0, timeout=60)
async def cpu_bursts(job: Job) -> dict[str, int]:
    """Legitimate async code with a bit of CPU work: ``bursts`` stretches of ``seconds`` of
    pure computation, each followed by an await. ``cpu``: seconds of the thread's CPU time (a
    fixed amount of work, however long a busy machine makes it take), else of wall time."""
    clock = time.thread_time if job.payload.get("cpu") else time.monotonic
    n = 0
    for _ in range(int(job.payload.get("bursts", 3))):
        end = clock() + float(job.payload.get("seconds", 0.3))
        while clock() < end:
            n += 1
        await asyncio.sleep(0.01)
    return {"loops": n}


@router.job("blocks_for", max_retries=0)
async def blocks_for(job: Job) -> None:
    """Blocks the event loop for ``seconds`` (no timeout: the block limit alone stops it):
    ``how`` "sleep" (``time.sleep``, no CPU) or "spin" (that many seconds of the thread's CPU
    time). Its ``start``/``end`` lines time the body; a last line ``cpu <seconds> <time> <id>``
    gives the CPU time it used."""
    record(job, "start")
    used = time.thread_time()
    try:
        seconds = float(job.payload.get("seconds", 5))
        if job.payload.get("how") == "sleep":
            time.sleep(seconds)
        else:
            end = used + seconds
            while time.thread_time() < end:
                pass
    finally:
        record(job, "end")
        record(job, f"cpu {time.thread_time() - used:.3f}")


def record(job: Job, what: str) -> None:
    path = job.payload.get("log")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{what} {time.time():.6f} {job.id}\n".encode())
        finally:
            os.close(fd)


def stuck(job: Job) -> None:
    """Blocking work that ignores every request to stop, for ``seconds`` (or until ``release``
    exists)."""
    record(job, "start")
    try:
        end = time.monotonic() + float(job.payload.get("seconds", 40))
        release = job.payload.get("release")
        while time.monotonic() < end and not (release and os.path.exists(release)):
            time.sleep(0.05)
    finally:
        record(job, "end")


@router.job("stuck_to_thread", max_retries=0, timeout=1)
async def stuck_to_thread(job: Job) -> None:
    """What the loop guard's message recommends for blocking code: it cannot be cancelled."""
    await asyncio.to_thread(stuck, job)


@router.job("quick_to_thread", max_retries=0, timeout=10)
async def quick_to_thread(job: Job) -> dict[str, bool]:
    await asyncio.to_thread(time.sleep, 0.05)
    return {"ok": True}


@router.job("swallows_cancel", max_retries=1, retry_delays=[1], timeout=1)
async def swallows_cancel(job: Job) -> dict[str, bool]:
    """Catches ``CancelledError`` and goes on until its ``seconds`` are up, then returns."""
    record(job, "start")
    end = time.monotonic() + float(job.payload.get("seconds", 4))
    while (left := end - time.monotonic()) > 0:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(left)
    record(job, "end")
    return {"finished": True}


@router.job("overruns_limited", max_retries=1, retry_delays=[1], timeout=1, concurrency=2)
async def overruns_limited(job: Job) -> dict[str, bool]:
    """``swallows_cancel`` under a fleet limit of 2: works on past its timeout (``seconds``)."""
    return await swallows_cancel(job)


@router.job("overruns_limited_sync", max_retries=1, retry_delays=[1], timeout=1, concurrency=2)
def overruns_limited_sync(job: Job) -> dict[str, bool]:
    """A sync body past its timeout (``seconds``, 4 by default), under a fleet limit of 2."""
    stuck(job)
    return {"finished": True}


@router.job("ignores_cancel", max_retries=1, retry_delays=[1], timeout=1)
async def ignores_cancel(job: Job) -> None:
    """Catches every ``CancelledError`` and runs on for good."""
    record(job, "start")
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.1)


@router.job("overrun_sync", max_retries=0, timeout=1, concurrency=2)
def overrun_sync(job: Job) -> dict[str, bool]:
    """Runs past its 1 s timeout (``seconds``, 4 by default), under a fleet limit of 2."""
    stuck(job)
    return {"finished": True}


@router.job("non_daemon_thread", max_retries=0, timeout=5)
async def non_daemon_thread(job: Job) -> None:
    """Leaves a non-daemon thread behind: the interpreter joins those at exit."""
    seconds = float(job.payload.get("seconds", 40))
    threading.Thread(target=time.sleep, args=(seconds,), daemon=False).start()
    record(job, "start")


@router.job("forks", max_retries=0, timeout=5)
async def forks(job: Job) -> None:
    """Forks a child that lives on (it inherits every descriptor of the worker)."""
    pid = os.fork()
    if pid == 0:  # the child: sleep, then leave without running any of the parent's cleanup
        try:
            time.sleep(float(job.payload.get("seconds", 40)))
        finally:
            os._exit(0)
    with open(job.payload["pidfile"], "w") as f:
        f.write(str(pid))


def overlap(lines: list[str]) -> int:
    """The most bodies running at once, from ``record``'s lines."""
    events = sorted((float(t), 1 if what == "start" else -1) for what, t, _ in
                    (line.split() for line in lines if line.strip()))  # fmt: skip
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def bodies(lines: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Each job's bodies as (start, end) pairs, in the order they started (a body that has not
    ended yet ends at infinity)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for what, t, job_id in sorted((line.split() for line in lines if line.strip()),
                                  key=lambda f: float(f[1])):  # fmt: skip
        runs = out.setdefault(job_id, [])
        if what == "start":
            runs.append((float(t), float("inf")))
        else:
            open_at = next(i for i, r in enumerate(runs) if r[1] == float("inf"))
            runs[open_at] = (runs[open_at][0], float(t))
    return out


def read_log(path: Any) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []
