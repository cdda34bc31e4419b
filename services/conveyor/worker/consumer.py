"""The worker process: deliveries → batched claim → handlers → batched state writes.

Flow per delivery: decode (malformed → rejected to the dead-letter queue) → claim in one
``UPDATE … WHERE id = ANY($1)`` for everything that arrived together (duplicates and jobs that
are not runnable are acked and dropped) → run the handler under its timeout while a heartbeat
extends the lease → outcome written fenced by (job id, attempt), batched with the other outcomes
ready at that moment → ack after that commit (see ``outcomes`` for the ack point).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from ..core.amqp.topology import Topology, connect
from ..core.backoff import Backoff
from ..core.config import Settings
from ..core.logging import event
from ..core.messages import MalformedMessage, decode
from ..core.metrics import Metrics
from ..job_types import router_types
from ..router import HandlerSpec, Job, JobRouter
from ..store import Attempt, ClaimedJob, Completion, Failure, for_schema
from ..store.connect import create_pool
from . import outcomes
from .acks import Acks
from .outcomes import Kind, Outcome

log = logging.getLogger("conveyor.worker")


@dataclass
class Running:
    job: Job
    spec: HandlerSpec | None
    task: asyncio.Task[None] | None = None
    started: float = field(default_factory=time.monotonic)
    lease_lost: bool = False
    message: AbstractIncomingMessage | None = None  # unacked while the job runs


class Worker:
    def __init__(
        self,
        settings: Settings,
        router: JobRouter,
        *,
        types: list[str] | None = None,
        concurrency: int = 16,
        metrics: Metrics | None = None,
        worker_id: str | None = None,
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
        self.topology = Topology(settings.namespace)
        self.store = for_schema(settings.db_schema)
        self.handler_defaults = {
            t: s.defaults() for t, s in router.handlers.items() if s.defaults()
        }

        self.pool: Any = None
        self.connection: AbstractRobustConnection | None = None
        self.channel: AbstractChannel | None = None
        self.queues: dict[str, AbstractQueue] = {}
        self.consumer_tags: dict[str, str] = {}
        self.inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self.acks = Acks()
        self.acked_early: set[uuid.UUID] = set()  # running jobs whose delivery was acked early
        self.results: asyncio.Queue[tuple[Running, Outcome]] = asyncio.Queue()
        self.slots = asyncio.Semaphore(concurrency)
        self.running: dict[uuid.UUID, Running] = {}
        self.executor = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="conveyor-handler"
        )
        # sync handlers' calls: a cancelled one keeps its thread until the handler returns
        self.threads: set[concurrent.futures.Future[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._current: asyncio.Future[None] | None = None
        self._idle = asyncio.Event()  # set when the last running job's outcome is written
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.pool = await create_pool(
            self.settings.database_url,
            application_name="conveyor-worker",
            max_size=4,
            command_timeout=30,
        )
        async with self.pool.acquire() as conn:  # the API accepts these types from now on
            await self.store.job_type_register_many(conn, router_types(self.router, self.types))
        self.connection = await connect(
            self.settings.amqp_url, name=f"conveyor-worker {self.worker_id}"
        )
        self.channel = await self.connection.channel(publisher_confirms=False)
        await self.channel.set_qos(prefetch_count=self.concurrency, global_=True)
        await self.topology.declare_base(self.channel)
        for t in self.types:
            self.queues[t] = await self.topology.declare_work_queue(self.channel, t)
        self._tasks = [
            asyncio.create_task(self._claim_loop(), name="claim"),
            asyncio.create_task(self._result_loop(), name="results"),
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
        ]
        for t, q in self.queues.items():
            self.consumer_tags[t] = await q.consume(self._on_message)
        event(log, "worker_started", worker_id=self.worker_id, types=self.types,
              concurrency=self.concurrency)  # fmt: skip

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self.acks.track(message)
        self.inbox.put_nowait(message)
        if self.acked_early and self.slots.locked():
            # deliveries beyond the slots only arrive once long jobs were acked early: this one
            # waits for a slot, its job is in hand and must not look lost to the reconciler
            await self._touch_waiting()

    async def _touch_waiting(self) -> None:
        """Deliveries waiting in the inbox for a slot (possible once long jobs' deliveries were
        acked early) are jobs in hand: refresh them so the reconciler, which only sees the
        queue's ready messages, does not take them for lost. Runs with the heartbeat, well
        inside the reconciler's deadline."""
        ids = []
        for msg in list(self.inbox._queue):  # type: ignore[attr-defined]
            with contextlib.suppress(MalformedMessage):
                ids.append(decode(msg.body).job_id)
        if ids:
            with contextlib.suppress(Exception):
                async with self.pool.acquire() as conn:
                    await self.store.job_touch_waiting(conn, ids)

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        await stop.wait()
        await self.stop()

    async def stop(self, grace: float | None = None) -> None:
        """Drain: stop consuming at once, let running jobs finish within ``grace`` seconds, hand
        back the rest (PENDING again, no retry consumed), write every outcome, close."""
        grace = self.settings.shutdown_grace if grace is None else grace
        self._stopping = True
        event(log, "worker_draining", running=len(self.running), grace=grace)
        if self.connection is not None and not self.connection.is_closed:
            await _quietly(
                asyncio.gather(
                    *(self.queues[t].cancel(tag) for t, tag in self.consumer_tags.items())
                )
            )
        self.consumer_tags.clear()
        claim = self._tasks[0] if self._tasks else None
        if claim is not None:
            claim.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await claim
        if self._current is not None and not self._current.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._current), 10)
        while not self.inbox.empty():
            msg = self.inbox.get_nowait()
            self.acks.forget(msg)
            await _quietly(msg.nack(requeue=True))
        tasks = [r.task for r in self.running.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for r in list(self.running.values()):
            if r.task is not None and not r.task.done():
                r.task.cancel()  # the handler's task reports RELEASE when cancelled
        pending = [r.task for r in self.running.values() if r.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=5)
        # flush: wait until the result loop has written everything
        if self.running:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 15)
        for task in self._tasks[1:]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.connection is not None:
            await _quietly(self.connection.close())
        if self.pool is not None:
            await _quietly(self.pool.close())
        self.executor.shutdown(wait=False, cancel_futures=True)
        event(log, "worker_stopped", worker_id=self.worker_id, abandoned=len(self.running))

    # ------------------------------------------------------------------ claim

    async def _claim_loop(self) -> None:
        while True:
            await self.slots.acquire()
            try:
                first = await self.inbox.get()
            except BaseException:
                self.slots.release()
                raise
            batch = [first]
            while not self.inbox.empty() and not self.slots.locked():
                await self.slots.acquire()
                batch.append(self.inbox.get_nowait())
            # shielded: a shutdown waits for a batch in flight instead of cutting it between the
            # claim's commit and the acks
            self._current = asyncio.ensure_future(self.process_batch(batch))
            await asyncio.shield(self._current)

    async def process_batch(self, batch: list[AbstractIncomingMessage]) -> None:
        """One step: decode, claim, ack, start handlers. Each message holds one slot on entry;
        slots of messages that do not start a handler are released here."""
        valid: list[tuple[AbstractIncomingMessage, uuid.UUID]] = []
        for msg in batch:
            try:
                valid.append((msg, decode(msg.body).job_id))
            except MalformedMessage as exc:
                self.metrics.messages_dead_lettered.inc()
                event(log, "message_rejected", logging.WARNING, reason=str(exc),
                      queue=msg.routing_key, message_id=msg.message_id)  # fmt: skip
                self.acks.forget(msg)
                with contextlib.suppress(Exception):
                    await msg.reject(requeue=False)
                self.slots.release()
        if not valid:
            return
        ids = list(dict.fromkeys(i for _, i in valid))
        rows = await self._claim(ids)
        if rows is None:  # shutting down while the database is unreachable
            for msg, _ in valid:
                self.acks.forget(msg)
                with contextlib.suppress(Exception):
                    await msg.nack(requeue=True)
                self.slots.release()
            return
        claimed = {r.id: r for r in rows}
        started: set[uuid.UUID] = set()
        dropped_ids: list[uuid.UUID] = []
        dropped: list[AbstractIncomingMessage] = []
        for msg, job_id in valid:
            row = claimed.get(job_id)
            if row is None or job_id in started:
                dropped_ids.append(job_id)  # a duplicate within this batch too
                # a duplicate, or a job that is not runnable: acknowledged, dropped
                dropped.append(msg)
                self.slots.release()
                continue
            started.add(job_id)
            self._start(row, msg)
        if dropped:
            await self.acks.ack(dropped)
        if dropped_ids:
            await self._explain_dropped(dropped_ids)

    async def _claim(self, ids: list[uuid.UUID]) -> list[ClaimedJob] | None:
        backoff = Backoff()
        while True:
            try:
                async with self.pool.acquire() as conn:
                    return await self.store.job_claim_many(
                        conn,
                        ids,
                        lease_seconds=self.settings.visibility_timeout,
                        worker_id=self.worker_id,
                        types=self.types,
                        handler_defaults=self.handler_defaults,
                        default_max_retries=self.settings.default_max_retries,
                    )
            except Exception as exc:
                if self._stopping:
                    return None
                delay = backoff.next()
                event(
                    log, "claim_failed", logging.WARNING, error=repr(exc), retry_in=round(delay, 2)
                )
                await asyncio.sleep(delay)

    async def _explain_dropped(self, ids: list[uuid.UUID]) -> None:
        try:
            async with self.pool.acquire() as conn:
                statuses = await self.store.job_status_many(conn, ids)
        except Exception:
            statuses = {}
        for job_id in ids:
            status = statuses.get(job_id)
            reason = "unknown_job" if status is None else f"status_{status.value.lower()}"
            self.metrics.messages_dropped.labels(reason).inc()
            event(log, "message_dropped", logging.INFO if status else logging.WARNING,
                  job_id=str(job_id), reason=reason)  # fmt: skip

    def _start(self, row: ClaimedJob, message: AbstractIncomingMessage | None = None) -> None:
        job = Job(
            id=row.id,
            type=row.job_type,
            payload=row.payload,
            attempt=row.attempts,
            priority=row.priority,
            retry_count=row.retry_count,
            max_retries=row.max_retries,
        )
        spec = self.router.handlers.get(job.type)
        running = Running(job, spec, message=message)
        self.running[job.id] = running
        running.task = asyncio.create_task(self._execute(running, row.timeout_seconds))

    # ------------------------------------------------------------------ run

    async def _execute(self, running: Running, timeout: float | None) -> None:
        job, spec = running.job, running.spec
        outcome: Outcome
        started = time.monotonic()
        try:
            if spec is None:
                raise LookupError(f"no handler registered for job type {job.type!r}")
            if spec.is_async:
                call: Any = spec.func(job)
            else:
                thread_call = self.executor.submit(spec.func, job)
                self.threads.add(thread_call)
                thread_call.add_done_callback(self.threads.discard)
                call = asyncio.wrap_future(thread_call)
            result = await asyncio.wait_for(call, timeout) if timeout else await call
            outcome = outcomes.completed(result)
        except asyncio.CancelledError:
            outcome = outcomes.RELEASE  # shutdown: hand the job back
        except TimeoutError:
            outcome = outcomes.failure(
                f"TimeoutError: attempt exceeded its timeout of {timeout} s",
                retry_count=job.retry_count, max_retries=job.max_retries, spec=spec,
            )  # fmt: skip
        except Exception as exc:
            outcome = outcomes.failed(
                exc, retry_count=job.retry_count, max_retries=job.max_retries, spec=spec
            )
        self.metrics.job_duration.labels(job.type).observe(time.monotonic() - started)
        self.results.put_nowait((running, outcome))

    # ------------------------------------------------------------------ results

    async def _result_loop(self) -> None:
        while True:
            batch = [await self.results.get()]
            while not self.results.empty():
                batch.append(self.results.get_nowait())
            await self.write_outcomes(batch)

    async def write_outcomes(self, batch: list[tuple[Running, Outcome]]) -> None:
        """One step: write a batch of outcomes in one transaction (fenced), then free slots."""
        done = [(r, o) for r, o in batch if o.kind is Kind.COMPLETE]
        fail = [(r, o) for r, o in batch if o.kind is Kind.FAIL]
        release = [(r, o) for r, o in batch if o.kind is Kind.RELEASE]
        backoff = Backoff(cap=2.0)
        while True:
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    written: set[uuid.UUID] = set()
                    if done:
                        written |= await self.store.job_complete_many(
                            conn,
                            [Completion(r.job.id, r.job.attempt, o.result_json) for r, o in done],
                        )
                    if fail:
                        failed = await self.store.job_fail_many(
                            conn,
                            [
                                Failure(r.job.id, r.job.attempt, o.error, o.delay, o.consume)
                                for r, o in fail
                            ],
                        )
                        written.update(failed)
                    if release:
                        written |= await self.store.job_release_many(
                            conn, [Attempt(r.job.id, r.job.attempt) for r, _ in release]
                        )
                    if fail or release:  # retries, dead letters, hand-backs: outbox rows
                        await self.store.outbox_notify(conn)
                break
            except Exception as exc:
                delay = backoff.next()
                event(log, "outcome_write_failed", logging.WARNING, error=repr(exc),
                      retry_in=round(delay, 2), count=len(batch))  # fmt: skip
                await asyncio.sleep(delay)
        for running, outcome in batch:
            job = running.job
            if job.id in written:
                self.metrics.jobs_finished.labels(job.type, outcome.label).inc()
                if outcome.kind is Kind.FAIL:
                    event(log, "job_attempt_failed", logging.WARNING, job_id=str(job.id),
                          type=job.type, attempt=job.attempt, outcome=outcome.label,
                          delay=outcome.delay, error=(outcome.error or "")[:300])  # fmt: skip
            else:
                self.metrics.fenced_writes.inc()
                event(log, "job_write_fenced", logging.WARNING, job_id=str(job.id),
                      attempt=job.attempt, outcome=outcome.label)  # fmt: skip
            if self.running.get(job.id) is running:
                del self.running[job.id]
                self.acked_early.discard(job.id)
            self.slots.release()
        await self.acks.ack(_take_messages(r for r, _ in batch))
        if not self.running:
            self._idle.set()

    # ------------------------------------------------------------------ heartbeat

    async def heartbeat_once(self) -> None:
        """Extend the leases of every running job; flag the ones cancelled or taken over."""
        running = list(self.running.values())
        if not running:
            return
        async with self.pool.acquire() as conn:
            alive = await self.store.job_heartbeat_many(
                conn,
                [Attempt(r.job.id, r.job.attempt) for r in running],
                lease_seconds=self.settings.visibility_timeout,
            )
        await self._touch_waiting()
        early = time.monotonic() - self.settings.early_ack_after
        late = [r for r in running if r.message is not None and r.started < early]
        self.acked_early.update(r.job.id for r in late)
        if late:  # before RabbitMQ's consumer_timeout: from here on the lease alone holds them
            await self.acks.ack(_take_messages(late))
        for r in running:
            if r.job.id not in alive:
                if r.task is not None and not r.task.done() and not r.lease_lost:
                    r.lease_lost = True
                    event(log, "job_lease_lost", logging.WARNING, job_id=str(r.job.id),
                          attempt=r.job.attempt)  # fmt: skip
                r.job._cancel.set()
            elif alive[r.job.id]:
                r.job._cancel.set()

    async def _heartbeat_loop(self) -> None:
        interval = max(0.2, self.settings.visibility_timeout / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat_once()
            except Exception as exc:
                event(log, "heartbeat_failed", logging.WARNING, error=repr(exc))


async def _quietly(aw: Any, timeout: float = 5.0) -> None:
    """Best effort during shutdown: a broker or database that is down must not hang a drain."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(aw, timeout)


def _take_messages(runs: Iterable[Running]) -> list[AbstractIncomingMessage]:
    """The deliveries still held by these jobs, handed over for acknowledgement (once)."""
    out = []
    for r in runs:
        if r.message is not None:
            out.append(r.message)
            r.message = None
    return out
