"""Deliveries → claims.

Each delivery is decoded (a malformed one is rejected to the dead-letter queue), then everything
that arrived together is claimed in one ``UPDATE … WHERE id = ANY($1)``: a job that is not
runnable (finished, cancelled, of a type this worker lacks) and a duplicate are acknowledged and
dropped with a log line and a metric; a claimed job goes to ``start``. Each delivery holds one
concurrency slot from the moment it is taken from the inbox; slots of deliveries that start no
handler are released here, the others when their outcome is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..broker.acks import Acks
from ..broker.consume import Delivery, MalformedMessage, job_id_of
from ..core.backoff import Backoff
from ..core.logging import event
from ..core.metrics import Metrics, observe_many
from ..store import ClaimedJob, Store
from ..store.attempts import HandlerDefaults

log = logging.getLogger("conveyor.worker")

T = TypeVar("T")
Start = Callable[[ClaimedJob, Delivery | None], None]  # None: acknowledged already


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    waiting: int  # deliveries in hand waiting for a slot
    claimed_total: int
    dropped_total: int
    rejected_total: int
    claim_failing_since: float | None


class Inbox:
    """Deliveries waiting for a slot, each with its job id decoded once on arrival (None:
    malformed). One reader (``Consumer.step``). Handed out highest priority first, in arrival
    order within a priority: with quorum queues (no broker-side priorities, two bands per type,
    ``broker/topology.py``) this is what lets a high-priority delivery overtake the normal band's
    prefetched backlog; with classic priority queues it only orders what was prefetched."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Delivery, uuid.UUID | None]] = []
        self._seq = itertools.count()
        self._arrived = asyncio.Event()

    def put(self, d: Delivery) -> uuid.UUID | None:
        job_id = _job_id(d)
        heapq.heappush(self._heap, (-d.priority, next(self._seq), d, job_id))
        self._arrived.set()
        return job_id

    async def wait(self) -> None:
        """Until a delivery is in the inbox."""
        while not self._heap:
            self._arrived.clear()
            await self._arrived.wait()

    def get_nowait(self) -> tuple[Delivery, uuid.UUID | None]:
        _, _, d, job_id = heapq.heappop(self._heap)
        return d, job_id

    def empty(self) -> bool:
        return not self._heap

    def __len__(self) -> int:
        return len(self._heap)

    def job_ids(self) -> list[uuid.UUID]:
        return [i for _, _, _, i in self._heap if i is not None]


class Consumer:
    def __init__(
        self,
        pool: Any,
        store: Store,
        metrics: Metrics,
        *,
        slots: asyncio.Semaphore,
        acks: Acks,
        start: Start,
        worker_id: str,
        types: list[str],
        handler_defaults: dict[str, dict[str, float | int]],
        visibility_timeout: float,
        default_max_retries: int,
        early_acked: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.slots = slots
        self.acks = acks
        self.start = start
        self.worker_id = worker_id
        self.types = types
        self.handler_defaults = HandlerDefaults.of(handler_defaults)  # encoded once
        self.visibility_timeout = visibility_timeout
        self.default_max_retries = default_max_retries
        self.clock = clock
        self.inbox = Inbox()
        self.early_acked = early_acked  # true while deliveries beyond the slots can arrive
        self.stopping = False
        self.current: asyncio.Future[None] | None = None  # the batch being claimed
        self._claimed = self._dropped = self._rejected = 0
        self._failing_since: float | None = None

    def status(self) -> ConsumerStatus:
        return ConsumerStatus(
            len(self.inbox), self._claimed, self._dropped, self._rejected, self._failing_since
        )

    async def offer(self, d: Delivery) -> None:
        """A delivery arrived (the broker's callback)."""
        self.acks.track(d)
        job_id = self.inbox.put(d)
        if job_id is not None and self.slots.locked() and self.early_acked():
            # deliveries beyond the slots only arrive once long jobs were acked early: this one
            # waits for a slot, its job is in hand and must not look lost to the reconciler
            await self._touch([job_id])

    async def touch_waiting(self) -> None:
        """Deliveries waiting in the inbox for a slot (possible once long jobs' deliveries were
        acked early) are jobs in hand: refresh them so the reconciler, which only sees the
        queue's ready messages, does not take them for lost. (The heartbeater's step: once per
        beat; ``offer`` touches only the delivery that arrived.)"""
        await self._touch(self.inbox.job_ids())

    async def _touch(self, ids: list[uuid.UUID]) -> None:
        if ids:
            with contextlib.suppress(Exception):
                async with self.pool.acquire() as conn:
                    await self.store.job_touch_waiting(
                        conn, ids, hold_seconds=self.visibility_timeout
                    )

    async def run(self) -> None:
        while True:
            await self.step()

    async def step(self) -> int:
        """One step: wait for a slot and a delivery, take every delivery ready (a slot each),
        claim them. Returns how many deliveries it took."""
        await self.slots.acquire()
        try:
            await self.inbox.wait()
        except BaseException:
            self.slots.release()
            raise
        batch = [self.inbox.get_nowait()]
        while not self.inbox.empty() and not self.slots.locked():
            await self.slots.acquire()
            batch.append(self.inbox.get_nowait())
        # shielded: a drain waits for a batch in flight instead of cutting it between the
        # claim's commit and the acks
        self.current = asyncio.ensure_future(self._process(batch))
        await asyncio.shield(self.current)
        return len(batch)

    async def process_batch(self, batch: list[Delivery]) -> None:
        """Decode, claim, ack what does not run, start the rest. Each delivery holds one slot
        on entry; slots of deliveries that do not start a handler are released here."""
        await self._process([(d, _job_id(d)) for d in batch])

    async def _process(self, batch: list[tuple[Delivery, uuid.UUID | None]]) -> None:
        valid: list[tuple[Delivery, uuid.UUID]] = []
        for d, job_id in batch:
            if job_id is not None:
                valid.append((d, job_id))
                continue
            self._rejected += 1
            self.metrics.messages_rejected.labels("malformed").inc()
            event(
                log,
                "message_rejected",
                logging.WARNING,
                reason=_why_malformed(d.body),
                queue=d.routing_key,
                message_id=d.message_id,
            )
            self.acks.forget(d)
            await d.reject(requeue=False)
            self.slots.release()
        if not valid:
            return
        rows = await self._claim(list(dict.fromkeys(i for _, i in valid)))
        if rows is None:  # draining while the database is unreachable
            for d, _ in valid:
                self.acks.forget(d)
                await d.nack(requeue=True)
                self.slots.release()
            return
        claimed = {r.id: r for r in rows}
        started: set[uuid.UUID] = set()
        dropped_ids: list[uuid.UUID] = []
        dropped: list[Delivery] = []
        waits: dict[str, list[float]] = {}  # queue wait per type: observed once per batch
        for d, job_id in valid:
            row = claimed.get(job_id)
            if row is None or job_id in started:
                # a duplicate (within this batch too), or a job that is not runnable
                dropped_ids.append(job_id)
                dropped.append(d)
                self.slots.release()
                continue
            started.add(job_id)
            self._claimed += 1
            waits.setdefault(row.job_type, []).append(row.wait_seconds)
            self.start(row, d)
        for job_type, values in waits.items():
            observe_many(self.metrics.job_wait_of(job_type), values)
        if dropped:
            await self.acks.ack(dropped)
        if dropped_ids:
            await self._explain_dropped(dropped_ids)

    async def _claim(self, ids: list[uuid.UUID]) -> list[ClaimedJob] | None:
        return await self._retrying(
            lambda conn: self.store.job_claim_many(
                conn,
                ids,
                lease_seconds=self.visibility_timeout,
                worker_id=self.worker_id,
                types=self.types,
                handler_defaults=self.handler_defaults,
                default_max_retries=self.default_max_retries,
            )
        )

    async def _retrying(self, claim: Callable[[Any], Awaitable[T]]) -> T | None:
        """``claim(conn)`` until it succeeds, with a backoff (``claim_failing_since`` meanwhile);
        None when the drain stops a claim that keeps failing."""
        backoff = Backoff()
        while True:
            try:
                async with self.pool.acquire() as conn:
                    result = await claim(conn)
                self._failing_since = None
                return result
            except Exception as exc:
                if self.stopping:
                    return None
                if self._failing_since is None:
                    self._failing_since = self.clock()
                delay = backoff.next()
                event(
                    log, "claim_failed", logging.WARNING, error=repr(exc), retry_in=round(delay, 2)
                )
                await asyncio.sleep(delay)

    async def _explain_dropped(self, ids: list[uuid.UUID]) -> None:
        self._dropped += len(ids)
        try:
            async with self.pool.acquire() as conn:
                statuses = {
                    i: st for i, (st, _) in (await self.store.job_fence_many(conn, ids)).items()
                }
        except Exception:
            statuses = {}
        for job_id in ids:
            status = statuses.get(job_id)
            reason = "unknown_job" if status is None else f"status_{status.value.lower()}"
            self.metrics.messages_dropped.labels(reason).inc()
            # a duplicate delivery is routine (debug); an unknown job is not
            event(
                log,
                "message_dropped",
                logging.DEBUG if status else logging.WARNING,
                job_id=str(job_id),
                reason=reason,
            )

    async def hand_back_waiting(self) -> int:
        """The drain: deliveries still waiting for a slot go back to their queue."""
        n = 0
        while not self.inbox.empty():
            d, _ = self.inbox.get_nowait()
            self.acks.forget(d)
            await d.nack(requeue=True)
            n += 1
        return n


def _job_id(d: Delivery) -> uuid.UUID | None:
    """The delivery's job id, None when it is malformed."""
    try:
        return job_id_of(d.body)
    except MalformedMessage:
        return None


def _why_malformed(body: bytes) -> str:
    try:
        job_id_of(body)
    except MalformedMessage as exc:
        return str(exc)
    return "malformed"
