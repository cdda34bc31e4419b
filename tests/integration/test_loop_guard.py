"""An async handler that blocks the event loop is preempted at its timeout (``worker/guard.py``),
so the other jobs of its worker pause for about that long, not for as long as it blocks."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import pytest

from conveyor.core.config import Settings
from conveyor.worker import Worker
from conveyor.worker.guard import BlockPenalty, LoopGuard
from conveyor.worker.loop import LoopMonitor

from .. import db as tdb
from ..stack import running_stack, wait_for
from .worker_apps import router

# A handler with ``timeout=1`` that calls ``time.sleep(8)`` in an ``async def`` is preempted by
# the loop guard: asyncio.timeout only fires once the loop turns, so without the guard it freezes
# its worker for 8 s and then COMPLETES, the neighbour 8 s late.


async def test_a_handler_blocking_the_loop_is_failed_at_its_timeout(
    settings: Settings, db_url: str
) -> None:
    async with running_stack(settings, None) as stack:
        worker = Worker(settings, router, concurrency=4)
        await worker.start()
        try:
            warm = await stack.submit("echo", {"warm": 1})
            await wait_for(db_url, [warm], statuses=["COMPLETED"], timeout=20)
            blocker = await stack.submit("blocks_loop_timeout", {"seconds": 8})
            await wait_for(db_url, [blocker], statuses=["IN_PROGRESS", "FAILED"], timeout=20)
            t0 = time.monotonic()
            neighbour = await stack.submit("echo", {"n": 1})
            await wait_for(db_url, [neighbour], statuses=["COMPLETED"], timeout=20)
            neighbour_took = time.monotonic() - t0
            await wait_for(db_url, [blocker], statuses=["FAILED"], timeout=20)
            assert worker.guard.status().preempted_total == 1
        finally:
            await worker.stop(grace=1)
    conn = await tdb.connect(db_url)
    try:
        error = await conn.fetchval("SELECT last_error FROM jobs WHERE id = $1",
                                    uuid.UUID(blocker))  # fmt: skip
    finally:
        await conn.close()
    assert error.startswith("LoopBlocked: the handler blocked the worker's event loop"), error
    # the loop was blocked for 1 s (the timeout) + detection (0.25 s tick, 0.1 s checks), not 8
    assert neighbour_took < 4, f"the neighbour waited {neighbour_took:.1f} s"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_guard_blames_only_a_handler_seen_blocking_twice() -> None:
    """``check_once`` with an injected clock: nothing while the loop turns, nothing for a task
    that is not a handler, nothing on the first sighting, then once per limit."""
    from prometheus_client import CollectorRegistry

    clock = _Clock()
    monitor = LoopMonitor(CollectorRegistry(), clock=clock)
    limits: dict[object, float] = {}
    guard = LoopGuard(monitor, lambda t: limits.get(t), clock=clock)
    guard.loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    assert current is not None
    assert not guard.check_once()  # the loop just turned
    clock.now += 5
    assert not guard.check_once()  # blocked, but not by a handler
    limits[current] = 1.0
    assert not guard.check_once()  # first sighting
    clock.now += 0.5
    assert not guard.check_once()  # the loop blocked 5.25 s, but this handler only 0.5 s of it
    clock.now += 0.5
    assert guard.check_once()  # it has been executing for its limit
    assert not guard.check_once()  # fired already
    clock.now += 1.0
    assert guard.check_once()  # still blocking a limit later: again
    with pytest.raises(BaseException, match="LoopBlocked"):
        guard.preempt()  # in the loop's thread, in the task decided on
    monitor.tick(clock.now)
    assert not guard.check_once()  # the loop turned


async def test_the_guard_does_not_count_the_time_the_loop_waited_for_a_cpu() -> None:
    """``check_once`` with an injected run-queue clock: a handler's stretch is charged its wall
    time less the time the loop's thread was runnable but waited for a CPU (machine load is
    not the handler's doing); time it ran or slept (``time.sleep``) counts."""
    from prometheus_client import CollectorRegistry

    clock, waited = _Clock(), _Clock()
    monitor = LoopMonitor(CollectorRegistry(), clock=clock)
    guard = LoopGuard(monitor, lambda t: 1.0, clock=clock, waited=waited)
    guard.loop = asyncio.get_running_loop()
    clock.now += 5
    assert not guard.check_once()  # first sighting
    clock.now += 1.5
    waited.now += 1.0
    assert not guard.check_once()  # 1.5 s on, 1 s of it waiting for a core: 0.5 s charged
    clock.now += 0.4
    waited.now += 0.1
    assert not guard.check_once()  # 0.8 s charged
    clock.now += 0.2  # running or sleeping, no wait: 1 s charged
    assert guard.check_once()


def test_the_guard_leaves_an_application_signal_handler_alone() -> None:
    from prometheus_client import CollectorRegistry

    previous = signal.signal(signal.SIGURG, lambda s, f: None)
    loop = asyncio.new_event_loop()
    try:
        guard = LoopGuard(LoopMonitor(CollectorRegistry()), lambda t: None)
        assert not guard.start(loop)
    finally:
        loop.close()
        signal.signal(signal.SIGURG, previous)


def test_a_type_preempted_for_blocking_is_spaced_out_for_a_while() -> None:
    """``BlockPenalty`` with an injected clock: nothing before an offence; then one attempt per
    ten limits, the others put back for that long; over a minute after the last offence."""
    clock = _Clock()
    penalty = BlockPenalty(0.5, clock=clock)
    assert penalty.admit("t") is None
    penalty.offended("t")
    assert penalty.admit("t") == 5.0 and penalty.admit("other") is None
    clock.now += 4.9
    assert penalty.admit("t") == 5.0
    clock.now += 0.1
    assert penalty.admit("t") is None  # 5 s on: one runs
    assert penalty.admit("t") == 5.0  # and the next waits 5 s more
    assert penalty.penalised() == ["t"]
    clock.now += 56
    assert penalty.admit("t") is None and penalty.admit("t") is None  # forgiven
    assert penalty.penalised() == []
