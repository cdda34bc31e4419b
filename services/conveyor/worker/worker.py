"""The worker process, composed of small parts with one job each:

- ``Subscription`` (``broker/consume.py``): the channel, its work queues, deliveries;
- ``Consumer`` (``consumer.py``): deliveries → claims, one batch at a time;
- ``Executor`` (``executor.py``): runs handlers (sync ones in threads, see ``threads.py``);
- ``Completer`` (``completer.py``): writes outcomes in batches, never stuck on a data error;
- ``Heartbeater`` (``heartbeater.py``): leases, cancellations, early acks;
- ``Drain`` (``drain.py``): SIGTERM;
- ``LoopMonitor`` (``loop.py``): event-loop lag, and the status snapshot the probe thread reads.

Each part has a one-step method for tests, an injectable clock and a small public status;
``Worker.status()`` gathers them for ``health.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from ..broker.acks import Acks
from ..broker.consume import Delivery, Subscription
from ..core import tracing
from ..core.config import Settings
from ..core.limits import shares
from ..core.logging import event
from ..core.metrics import Metrics, observe_many
from ..jobs.router import JobRouter
from ..jobs.types import register_router_schedules, router_types
from ..store import ClaimedJob, for_schema
from ..store.bounds import SessionBounds
from ..store.connect import create_pool
from ..store.notify import Notifier
from . import outcomes
from .completer import Completer, Pending
from .consumer import Consumer
from .controls import TypeControls, consumer_switch
from .drain import Drain, quietly
from .executor import Executor
from .follow import Follower
from .guard import BlockPenalty, LoopGuard
from .heartbeater import Heartbeater, take_deliveries
from .jobctx import attempt_of
from .loop import LoopMonitor
from .progress import ProgressWriter
from .running import Running
from .sidework import SIDE_THREADS
from .status import WorkerStatus

log = logging.getLogger("conveyor.worker")

# Connections of a worker's pool: claims, the outcome batch, heartbeats, progress and type
# controls share them; outcomes written alone (large results) may hold at most half.
POOL_SIZE = 4


class Worker:
    heartbeater: Heartbeater

    def __init__(
        self,
        settings: Settings,
        router: JobRouter,
        *,
        types: list[str] | None = None,
        concurrency: int = 16,
        weights: dict[str, int] | None = None,
        metrics: Metrics | None = None,
        worker_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.settings = settings
        self.router = router
        self.types = sorted(types) if types else router.types
        unknown = [t for t in self.types if t not in router.handlers]
        if unknown:
            raise ValueError(f"no handler registered for {', '.join(unknown)}")
        if not self.types:
            raise ValueError("the router has no handlers")
        self.concurrency = concurrency
        self.metrics = metrics or Metrics()
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.clock = clock
        self.pool: Any = None
        self.running: dict[uuid.UUID, Running] = {}
        self.slots = asyncio.Semaphore(concurrency)
        self.acks = Acks()
        declared = {t: s.weight for t, s in router.handlers.items() if s.weight is not None}
        self.shares = shares(
            concurrency, {**declared, **(weights or {})}, self.types, given=weights
        )
        self.subscription = Subscription(
            settings.amqp_url,
            settings.namespace,
            name=f"conveyor-worker {self.worker_id}",
            prefetch=concurrency,
            shares=self.shares,
            queue_type=settings.queue_type,
            heartbeat=settings.worker_amqp_heartbeat,
        )
        self.store = for_schema(settings.db_schema)
        defaults = {t: s.defaults() for t, s in router.handlers.items() if s.defaults()}
        self.controls = TypeControls(
            None,
            self.store,
            types=self.types,
            interval=settings.type_refresh_interval,
            on_pause=consumer_switch(self.subscription, lambda: self.stopping),
        )
        self.progress = ProgressWriter(None, self.store, interval=settings.progress_interval)
        self.consumer = Consumer(
            None,
            self.store,
            self.metrics,
            slots=self.slots,
            acks=self.acks,
            start=self._start,
            worker_id=self.worker_id,
            types=self.types,
            handler_defaults=defaults,
            visibility_timeout=settings.visibility_timeout,
            default_max_retries=settings.default_max_retries,
            early_acked=lambda: bool(self.heartbeater.acked_early),
            clock=clock,
        )
        self.executor = Executor(
            self.metrics,
            concurrency=concurrency,
            abandoned_limit=settings.worker_abandoned_thread_limit,
            max_result_bytes=settings.max_result_bytes,
            report=self._report,
            overrun_limit=settings.worker_overrun_limit,
            middlewares=router.middlewares,
            penalty=(
                BlockPenalty(settings.worker_loop_block_limit, clock=clock)
                if settings.worker_loop_block_limit
                else None
            ),
            clock=clock,
        )
        self.notifier = Notifier(None, self.store)
        self.follower = Follower(
            self.store,
            enabled=settings.worker_run_released,
            quiet=self.consumer.inbox.empty,
            stopping=lambda: self.stopping,
            worker_id=self.worker_id,
            types=self.types,
            handler_defaults=self.consumer.handler_defaults,
            lease_seconds=settings.visibility_timeout,
            default_max_retries=settings.default_max_retries,
        )
        self.completer = Completer(
            None,
            self.store,
            self.metrics,
            done=self._done,
            wake_relay=self.notifier.wake,
            follow=self.follower,
            clock=clock,
            apart=POOL_SIZE // 2,  # the other half: the batch, the claims, the heartbeats
            lease_seconds=settings.visibility_timeout,
            log_tracebacks=settings.log_tracebacks,
            admission_window=settings.admission_window,
        )
        self.heartbeater = Heartbeater(
            None,
            self.store,
            running=self.running,
            acks=self.acks,
            touch_waiting=self.consumer.touch_waiting,
            visibility_timeout=settings.visibility_timeout,
            early_ack_after=settings.early_ack_after,
            clock=clock,
        )
        # set when the last running job's outcome is written (but those of work given up on)
        self.idle = asyncio.Event()
        self.drain = Drain(self.consumer, self.subscription, self.executor, self.running, self.idle)
        block = settings.worker_loop_block_limit  # a short one needs quicker ticks and checks
        self.monitor = LoopMonitor(
            self.metrics.registry,
            on_tick=self._snapshot,
            clock=clock,
            interval=min(0.25, block / 2) if block else 0.25,
        )
        self.guard = LoopGuard(
            self.monitor, self._preempt_limit, interval=min(0.1, block / 4) if block else 0.1
        )
        self.loops: dict[str, asyncio.Task[None]] = {}
        self.snapshot: WorkerStatus | None = None  # refreshed on every loop tick
        self.stopping = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the pool, register the types, subscribe and start the loops. A start that fails
        (the broker unreachable) closes what it opened: the process tries again with backoff
        for as long as the outage lasts, and each try would leave its sessions open."""
        try:
            await self._open()
        except BaseException:
            await self.notifier.stop()
            await quietly(self.subscription.close())
            if self.pool is not None:
                await quietly(self.pool.close())
                self.pool = None
            raise

    async def _open(self) -> None:
        self.pool = await create_pool(
            self.settings.database_url,
            application_name="conveyor-worker",
            max_size=POOL_SIZE,
            command_timeout=30,
            pooler=self.settings.db_pooler,
            bounds=SessionBounds.of(self.settings),
        )
        self.consumer.pool = self.completer.pool = self.heartbeater.pool = self.pool
        self.notifier.pool = self.pool
        self.notifier.start()
        self.controls.pool = self.progress.pool = self.pool
        async with self.pool.acquire() as conn:  # the API accepts these types from now on
            await self.store.job_type_register_many(conn, router_types(self.router, self.types))
            await register_router_schedules(conn, self.router, self.types, store=self.store)
        await self.subscription.open(self.types)
        await self.controls.refresh_once()  # paused types are not consumed from the start
        for t in self.types:
            self.metrics.queue_messages.labels(
                self.subscription.topology.work_queue(t), "unacked"
            ).set_function(
                lambda t=t: self._unacked(t)  # type: ignore[misc]
            )
        self.loops = {
            "consumer": self._loop("consumer", self.consumer.run()),
            "completer": self._loop("completer", self.completer.run()),
            "heartbeater": self._loop("heartbeater", self.heartbeater.run()),
            "loop_monitor": self._loop("loop_monitor", self.monitor.run()),
            "type_controls": self._loop("type_controls", self.controls.run()),
            "progress": self._loop("progress", self.progress.run()),
        }
        await self.subscription.consume(self.consumer.offer)
        # to_thread work is counted against its attempt, and never queues behind stuck work
        asyncio.get_running_loop().set_default_executor(SIDE_THREADS)
        if not self.guard.start(asyncio.get_running_loop()):
            why = "the event loop is not in the main thread, or SIGURG has a handler"
            event(log, "loop_guard_off", logging.WARNING, reason=why)
        elif self.guard.waited is None:  # no run-queue delay to leave out (guard.py)
            why = "the kernel does not report the loop thread's wait for a CPU"
            event(log, "loop_guard_wall_time", logging.INFO, reason=why)
        self._snapshot()
        event(
            log,
            "worker_started",
            worker_id=self.worker_id,
            types=self.types,
            concurrency=self.concurrency,
        )

    @staticmethod
    def _loop(name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(_report_death)
        return task

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        await stop.wait()
        await self.stop()

    async def stop(self, grace: float | None = None) -> None:
        """Drain (see ``drain.py``), then close."""
        grace = self.settings.shutdown_grace if grace is None else grace
        self.stopping = True
        event(log, "worker_draining", running=len(self.running), grace=grace)
        await self.drain.run(grace, self.loops.get("consumer"))
        self.guard.stop()
        for task in self.loops.values():
            task.cancel()
        await asyncio.gather(*self.loops.values(), return_exceptions=True)
        await self.notifier.stop()
        await quietly(self.subscription.close())
        if self.pool is not None:
            await quietly(self.pool.close())
        self._snapshot()
        event(
            log,
            "worker_stopped",
            worker_id=self.worker_id,
            abandoned=len(self.running),
            threads_alive=self.executor.threads.status().alive,
        )

    # ------------------------------------------------------------------ one-step methods

    async def process_batch(self, batch: list[Delivery]) -> None:
        """Claim a batch of deliveries (each holding one slot) and start their handlers."""
        await self.consumer.process_batch(batch)

    # ------------------------------------------------------------------ the parts' seams

    def _start(self, row: ClaimedJob, delivery: Delivery | None) -> None:
        running = self._running(row, delivery)
        self.running[running.job.id] = running
        self.executor.start(running)

    def _running(self, row: ClaimedJob, delivery: Delivery | None) -> Running:
        """The attempt of a claimed job, as the executor runs it."""
        known = None if self.settings.accept_unknown_types else (lambda: self.controls.known)
        running = attempt_of(
            row,
            self.router,
            self.clock(),
            self.progress,
            known_types=known,
            max_payload_bytes=self.settings.max_payload_bytes,
            delivery=delivery,
        )
        if tracing.enabled():  # the attempt's span: child of the message's, else the job's
            header = tracing.valid(getattr(delivery, "traceparent", None))
            running.trace_parent = header or row.trace_context
        return running

    def _preempt_limit(self, task: asyncio.Task[Any]) -> float | None:
        """How long the async handler running in ``task`` may block the loop before the guard
        preempts it: its timeout, or ``worker_loop_block_limit`` if shorter (None: not inside an
        async handler, or neither; liveness fails after ``worker_loop_stall_limit`` then)."""
        running = self.executor.tasks.get(task)
        if running is None or not running.in_handler:  # only async handlers' own code
            return None
        limits = [x for x in (running.timeout, self.settings.worker_loop_block_limit) if x]
        return min(limits) if limits else None

    def _unacked(self, job_type: str) -> int:
        """Deliveries of ``job_type`` this worker holds unacknowledged (the broker's unacked)."""
        return sum(
            1
            for r in list(self.running.values())
            if r.delivery_type == job_type and r.delivery is not None
        )

    def _report(self, running: Running, outcome: Any) -> None:
        running.last_progress = self.progress.take(running.job.id)
        self.completer.put(running, outcome)

    async def _done(self, batch: list[Pending]) -> None:
        """Outcomes committed (or fenced): free their slots, ack the batch's deliveries. The
        jobs the batch released and claimed (``follow.py``) take over slots of the batch's jobs,
        each with that job's delivery, unacknowledged until its own outcome is written. A worker
        that is stopping starts none of them: it hands them back (PENDING again, their outbox
        rows written, no retry consumed) as the drain does with deliveries waiting for a slot;
        each keeps its slot until that is written, and the drain's flush waits for it."""
        claimed = batch[0].follow.jobs if batch and batch[0].follow is not None else []
        for p in batch:
            job_id = p.running.job.id
            if self.running.get(job_id) is p.running:
                del self.running[job_id]
                self.heartbeater.acked_early.discard(job_id)
        for _ in range(len(batch) - len(claimed)):  # at most one claimed job per batch job
            self.slots.release()  # its work has ended (executor.py holds work given up on)
        if claimed and self.stopping:
            for row in claimed:
                running = self._running(row, None)
                self.running[row.id] = running
                self.completer.put(running, outcomes.RELEASE)
        elif claimed:
            givers = [p.running for p in batch if p.running.delivery is not None]
            waits: dict[str, list[float]] = {}
            for i, row in enumerate(claimed):
                waits.setdefault(row.job_type, []).append(row.wait_seconds)
                running = self._running(row, None)  # its span: the job's, not the delivery's
                if i < len(givers):  # else that job's delivery was acknowledged early
                    giver = givers[i]
                    running.delivery, giver.delivery = giver.delivery, None
                    running.handed_at, running.handed_type = giver.delivered, giver.delivery_type
                self.running[row.id] = running
                self.executor.start(running)
            for job_type, values in waits.items():
                self.metrics.released_claimed.labels(job_type).inc(len(values))
                observe_many(self.metrics.job_wait_of(job_type), values)
        if all(r.given_up_at is not None for r in self.running.values()):
            self.idle.set()  # (work given up on is not the drain's to wait for)
        await self.acks.ack(take_deliveries([p.running for p in batch]))

    # ------------------------------------------------------------------ status

    def status(self) -> WorkerStatus:
        """Each part's status, gathered (``health.py`` reads this, never the parts)."""
        dead = [name for name, t in self.loops.items() if t.done()]
        return WorkerStatus(
            worker_id=self.worker_id,
            concurrency=self.concurrency,
            running=len(self.running),
            stopping=self.stopping,
            broker_connected=self.subscription.connected,
            consuming=self.subscription.consuming,
            dead_parts=[] if self.stopping else dead,
            consumer=self.consumer.status(),
            executor=self.executor.status(),
            completer=self.completer.status(),
            heartbeat=self.heartbeater.status(),
            loop=self.monitor.status(),
            guard=self.guard.status(),
            acks=self.acks.status(),
            drain=self.drain.status(),
        )

    def _snapshot(self) -> None:
        self.snapshot = self.status()


def _report_death(task: asyncio.Task[None]) -> None:
    """A part's loop ended on its own: say why (liveness reports it as a dead part)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        event(log, "worker_part_died", logging.ERROR, part=task.get_name(), error=repr(exc))
