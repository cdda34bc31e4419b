"""The worker's parts, one step at a time, without services: the executor's outcomes for
handlers that misbehave, sync timeouts measured from the thread's start, the loop monitor, and
liveness as a pure function of a status."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from conveyor import Job, JobRouter, Retry
from conveyor.core.metrics import Metrics
from conveyor.worker.executor import Executor
from conveyor.worker.health import Limits, assess
from conveyor.worker.loop import LoopMonitor
from conveyor.worker.outcomes import Kind, Outcome
from conveyor.worker.running import Running
from conveyor.worker.threads import HandlerThreads, HandlerTimeout


def _running(func: Any, *, timeout: float | None = None, max_retries: int = 0) -> Running:
    router = JobRouter()
    router.job("t", max_retries=max_retries)(func)
    job = Job(uuid.uuid4(), "t", {}, 1, 5, 0, max_retries)
    return Running(job, router.handlers["t"], timeout, time.monotonic())


def _executor(reported: list[Outcome] | None = None) -> Executor:
    out = reported if reported is not None else []
    return Executor(Metrics(), concurrency=2, abandoned_limit=1,
                    report=lambda r, o: out.append(o))  # fmt: skip


async def _cancels(job: Job) -> None:
    raise asyncio.CancelledError


async def _exits(job: Job) -> None:
    raise SystemExit(2)


async def _interrupts(job: Job) -> None:
    raise KeyboardInterrupt


async def _generator_exit(job: Job) -> None:
    raise GeneratorExit


def _sync_exits(job: Job) -> None:
    raise SystemExit(5)


async def _retry_now(job: Job) -> None:
    raise Retry(0)


async def _own_timeout(job: Job) -> None:
    raise TimeoutError("the handler's own network timeout")


async def _sleeps(job: Job) -> None:
    await asyncio.sleep(5)


@pytest.mark.parametrize(
    ("func", "timeout", "kind", "delay", "text"),
    [
        (_cancels, None, Kind.FAIL, None, "CancelledError"),
        (_exits, None, Kind.FAIL, None, "SystemExit"),
        (_interrupts, None, Kind.FAIL, None, "KeyboardInterrupt"),
        (_generator_exit, None, Kind.FAIL, None, "GeneratorExit"),
        (_sync_exits, None, Kind.FAIL, None, "SystemExit"),
        (_retry_now, None, Kind.FAIL, 1, "Retry"),
        (_own_timeout, 5, Kind.FAIL, None, "the handler's own network timeout"),
        (_sleeps, 0.05, Kind.FAIL, None, "exceeded its timeout of 0.05 s"),
    ],
)
async def test_every_attempt_ends_in_one_outcome(
    func: Any, timeout: float | None, kind: Kind, delay: int | None, text: str
) -> None:
    reported: list[Outcome] = []
    outcome = await _executor(reported).run_one(_running(func, timeout=timeout))
    assert (outcome.kind, outcome.delay) == (kind, delay)
    assert text in (outcome.error or ""), outcome.error
    assert reported == [outcome]


async def test_a_drain_cancellation_hands_the_job_back() -> None:
    reported: list[Outcome] = []
    ex = _executor(reported)
    running = _running(_sleeps)
    ex.start(running)
    await asyncio.sleep(0)
    assert ex.status().running == 1
    assert ex.hand_back_all() == 1
    assert running.task is not None
    await running.task
    assert [o.kind for o in reported] == [Kind.RELEASE]
    assert ex.status().running == 0


async def test_a_sync_timeout_counts_from_the_thread_start() -> None:
    """One thread at most (size 1, no room for abandoned ones): a call past its timeout keeps its
    thread until its work ends (``on_deadline`` tells it to stop; what it returns late is a
    timeout), the second call waits for that thread, and its timeout only starts once its own
    thread runs."""
    threads = HandlerThreads(1, 0)
    release = threading.Event()
    told: list[bool] = []
    first = asyncio.create_task(
        threads.call(lambda _: release.wait(5), None, 0.05, on_deadline=lambda: told.append(True))
    )
    second = asyncio.create_task(threads.call(lambda _: time.sleep(0.05) or "ran", None, 0.5))
    # longer than the second call's timeout: measured from submission it would time out here
    await asyncio.sleep(0.7)
    assert told == [True] and not first.done()  # past its deadline, still running
    status = threads.status()
    assert (status.alive, status.abandoned, status.waiting) == (1, 0, 1) and not second.done()
    release.set()
    with pytest.raises(HandlerTimeout):  # it returned True, after its deadline
        await first
    assert await second == "ran"
    status = threads.status()
    assert (status.alive, status.abandoned, status.waiting) == (0, 0, 0)


async def test_a_call_still_running_past_its_give_up_bound_is_abandoned() -> None:
    """Past timeout + ``give_up_after`` the timeout is raised while the thread runs on: counted
    as abandoned, and ``on_give_up`` gets a future done when the thread ends."""
    threads = HandlerThreads(1, 1)
    release = threading.Event()
    given: list[asyncio.Future[object]] = []
    t0 = time.monotonic()
    with pytest.raises(HandlerTimeout):
        await threads.call(lambda _: release.wait(5), None, 0.05, give_up_after=0.2,
                           on_give_up=given.append)  # fmt: skip
    assert 0.25 <= time.monotonic() - t0 < 2
    assert len(given) == 1 and not given[0].done()
    assert (threads.status().alive, threads.status().abandoned) == (1, 1)
    release.set()
    await asyncio.wait_for(given[0], 2)
    assert (threads.status().alive, threads.status().abandoned) == (0, 0)


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_work_given_up_on_holds_its_job_until_it_ends(kind: str) -> None:
    """Past its timeout + ``overrun_limit`` the work is given up on, but its outcome (a timeout)
    is reported only once it has ended: until then its job is held (no retry beside it), its
    attempt is out of ``tasks`` (the drain neither waits for it nor hands it back), counted as
    ``given_up`` and noted."""
    stop = threading.Event()

    async def ignores(job: Job) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)

    def blocks(job: Job) -> None:
        stop.wait(5)

    reported: list[Outcome] = []
    ex = Executor(Metrics(), concurrency=2, abandoned_limit=1, overrun_limit=0.1,
                  report=lambda r, o: reported.append(o))  # fmt: skip
    running = _running(ignores if kind == "async" else blocks, timeout=0.05)
    ex.start(running)
    task = running.task
    assert task is not None
    try:
        deadline = time.monotonic() + 5
        while ex.status().given_up < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert reported == [] and not task.done()
        assert task not in ex.tasks and running.note and "IN_PROGRESS until" in running.note
        assert ex.status().tasks_abandoned == (1 if kind == "async" else 0)
    finally:
        stop.set()
    await asyncio.wait_for(task, 5)
    [outcome] = reported
    assert outcome.kind is Kind.FAIL and "TimeoutError" in (outcome.error or ""), outcome
    assert ex.status().given_up == 0 and ex.status().tasks_abandoned == 0


async def test_a_call_handed_back_past_its_deadline_abandons_its_thread() -> None:
    """The drain cancels the caller: the thread runs on, counted as abandoned until it ends."""
    threads = HandlerThreads(1, 1)
    release = threading.Event()
    call = asyncio.create_task(threads.call(lambda _: release.wait(5), None, 0.05))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert (threads.status().alive, threads.status().abandoned) == (1, 1)
    release.set()
    for _ in range(100):
        if threads.status().alive == 0:
            break
        await asyncio.sleep(0.01)
    assert (threads.status().alive, threads.status().abandoned) == (0, 0)


async def test_base_exceptions_from_threads_reach_the_caller() -> None:
    threads = HandlerThreads(1, 1)
    with pytest.raises(SystemExit):
        await threads.call(_sync_exits, None, None)
    assert threads.status().alive == 0


def test_the_loop_monitor_measures_lag_with_its_clock() -> None:
    now = [100.0]
    m = LoopMonitor(CollectorRegistry(), interval=0.25, clock=lambda: now[0])
    now[0] = 100.3
    assert m.tick(expected=100.25) == pytest.approx(0.05)
    now[0] = 112.3  # the loop has not turned for 12 s
    assert m.blocked_for() == pytest.approx(11.75)
    m.tick(expected=100.55)
    assert m.status().max_lag_seconds == pytest.approx(11.75) and m.blocked_for() == 0


async def test_liveness_is_a_function_of_the_status() -> None:
    from conveyor.core.config import Settings
    from conveyor.worker import Worker

    router = JobRouter()
    router.job("t")(_sleeps)
    base = Worker(Settings(), router, concurrency=2).status()
    limits = Limits(broker_grace=60, loop_stall=10, outcome_deadline=60, abandoned_threads=1)

    def live(s: Any, blocked: float = 0.0, down: float = 0.0) -> bool:
        return assess(s, limits, now=1000.0, blocked_for=blocked, broker_down_for=down)[0]

    ex, co = base.executor, base.completer
    assert live(base)
    assert not live(base, blocked=11)
    assert not live(base, down=61)
    assert not live(dataclasses.replace(base, dead_parts=["completer"]))
    assert not live(
        dataclasses.replace(base, completer=dataclasses.replace(co, oldest_since=900.0))
    )
    assert live(dataclasses.replace(base, completer=dataclasses.replace(co, oldest_since=990.0)))
    isolated = dataclasses.replace(base, completer=dataclasses.replace(co, waiting=1, isolated=1))
    healthy, details = assess(isolated, limits, now=1000.0, blocked_for=0, broker_down_for=0)
    assert healthy and details["outcomes_isolated"] == 1  # one job's write: shown, not fatal
    assert live(dataclasses.replace(base, executor=dataclasses.replace(ex, threads_abandoned=1)))
    assert not live(
        dataclasses.replace(base, executor=dataclasses.replace(ex, threads_abandoned=2))
    )
    waiting = dataclasses.replace(ex, threads_waiting=1, threads_waiting_since=900.0)
    assert not live(dataclasses.replace(base, executor=waiting))
    assert live(dataclasses.replace(base, stopping=True), blocked=30)  # draining is healthy


# A delivery that arrives while the slots are full must not re-decode every delivery waiting in
# the inbox and touch all of their jobs: n deliveries would cost n(n+1)/2 decodes and touched ids
# (1,275 ids for 50).


class _TouchStore:
    def __init__(self) -> None:
        self.touched: list[uuid.UUID] = []

    async def job_touch_waiting(
        self, conn: object, ids: list[uuid.UUID], *, hold_seconds: float
    ) -> None:
        assert hold_seconds == 30  # held for a lease (the worker's visibility timeout)
        self.touched.extend(ids)


class _Pool:
    def acquire(self) -> Any:
        class _Conn:
            async def __aenter__(self) -> object:
                return object()

            async def __aexit__(self, *exc: object) -> None:
                return None

        return _Conn()


async def test_deliveries_waiting_for_a_slot_are_touched_once_each_on_arrival() -> None:
    from conveyor.broker import wire
    from conveyor.broker.acks import Acks
    from conveyor.broker.consume import Delivery
    from conveyor.worker.consumer import Consumer

    store = _TouchStore()
    slots = asyncio.Semaphore(1)
    await slots.acquire()  # every slot taken by a long job whose delivery was acked early
    consumer = Consumer(
        _Pool(), store, Metrics(), slots=slots, acks=Acks(), start=lambda r, d: None,  # type: ignore[arg-type]
        worker_id="w", types=["t"], handler_defaults={}, visibility_timeout=30,
        default_max_retries=0, early_acked=lambda: True,
    )  # fmt: skip
    ids = [uuid.uuid4() for _ in range(50)]
    for i, job_id in enumerate(ids):
        await consumer.offer(Delivery(wire.encode(job_id, "t"), "t", None, i + 1, "channel"))
    await consumer.offer(Delivery(b"not a message", "t", None, 99, "channel"))
    assert store.touched == ids  # each once, on arrival
    assert consumer.status().waiting == 51
    store.touched.clear()
    await consumer.touch_waiting()  # the heartbeater's step: every waiting job once
    assert store.touched == ids
