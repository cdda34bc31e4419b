"""Keeping running jobs' leases, and their deliveries within RabbitMQ's ``consumer_timeout``.

Every ``visibility_timeout / 3`` seconds one statement extends the lease of every running job
(fenced by attempt), skipping rows another transaction holds (the worker's own outcome batch,
waiting on a lock): such a job is neither extended nor lost this time. A job missing from the
answer was taken over (its lease expired) or its row is gone, and a job whose cancellation was
requested is told so through ``job.cancel_requested``; the note of an attempt whose work was
given up on (it holds its job IN_PROGRESS, ``executor.py``) goes to its job's ``last_error``.
Deliveries held longer than ``early_ack_after`` are acknowledged early (the lease alone holds
their jobs from then on; a delivery a finished job handed to a job it released, ``follow.py``,
counts from that job's claim), and deliveries waiting for a slot are touched so the
reconciler does not take their jobs for lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..broker.acks import Acks
from ..broker.consume import Delivery
from ..core.logging import event
from ..store import Attempt, Store
from .running import Running

log = logging.getLogger("conveyor.worker")


@dataclass(frozen=True, slots=True)
class HeartbeatStatus:
    last_beat_at: float | None  # clock time of the last successful beat
    failing_since: float | None
    leases_lost_total: int
    acked_early_total: int


class Heartbeater:
    def __init__(
        self,
        pool: Any,
        store: Store,
        *,
        running: dict[uuid.UUID, Running],
        acks: Acks,
        touch_waiting: Callable[[], Awaitable[None]],
        visibility_timeout: float,
        early_ack_after: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.store = store
        self.running = running
        self.acks = acks
        self.touch_waiting = touch_waiting
        self.visibility_timeout = visibility_timeout
        self.early_ack_after = early_ack_after
        self.clock = clock
        self.acked_early: set[uuid.UUID] = set()  # running jobs whose delivery was acked early
        self._last: float | None = None
        self._failing_since: float | None = None
        self._lost = 0
        self._early = 0

    def status(self) -> HeartbeatStatus:
        return HeartbeatStatus(self._last, self._failing_since, self._lost, self._early)

    async def run(self) -> None:
        interval = max(0.2, self.visibility_timeout / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.beat_once()
                self._failing_since = None
            except Exception as exc:
                if self._failing_since is None:
                    self._failing_since = self.clock()
                event(log, "heartbeat_failed", logging.WARNING, error=repr(exc))

    async def beat_once(self) -> None:
        """One step: extend the leases of every running job; flag the ones cancelled or taken
        over; acknowledge long jobs' deliveries early."""
        running = list(self.running.values())
        if not running:
            self._last = self.clock()
            return
        async with self.pool.acquire() as conn:
            beat = await self.store.job_heartbeat_many(
                conn,
                [Attempt(r.job.id, r.job.attempt) for r in running],
                lease_seconds=self.visibility_timeout,
            )
        self._last = self.clock()
        await self._write_notes(running)
        await self.touch_waiting()
        early = self.clock() - self.early_ack_after
        late = [r for r in running if r.delivery is not None and r.delivered < early]
        if late:  # before RabbitMQ's consumer_timeout: from here on the lease alone holds them
            self.acked_early.update(r.job.id for r in late)
            self._early += len(late)
            await self.acks.ack(take_deliveries(late))
        alive = beat.extended
        for r in running:
            if r.job.id in beat.busy:  # its row held elsewhere (its own outcome batch): next beat
                continue
            if r.job.id not in alive:
                if r.task is not None and not r.task.done() and not r.lease_lost:
                    r.lease_lost = True
                    self._lost += 1
                    event(
                        log,
                        "job_lease_lost",
                        logging.WARNING,
                        job_id=str(r.job.id),
                        attempt=r.job.attempt,
                    )
                r.job._cancel.set()
            elif alive[r.job.id]:
                r.job._cancel.set()

    async def _write_notes(self, running: list[Running]) -> None:
        """Notes not yet written (``Running.note``), once each; a failed write is tried again
        at the next beat."""
        notes = [r for r in running if r.note is not None and not r.noted]
        if not notes:
            return
        try:
            async with self.pool.acquire() as conn:
                await self.store.job_note_many(
                    conn, [(Attempt(r.job.id, r.job.attempt), r.note or "") for r in notes]
                )
        except Exception as exc:
            event(log, "job_note_failed", logging.WARNING, error=repr(exc))
            return
        for r in notes:
            r.noted = True


def take_deliveries(runs: list[Running]) -> list[Delivery]:
    """The deliveries still held by these jobs, handed over for acknowledgement (once)."""
    out = []
    for r in runs:
        if r.delivery is not None:
            out.append(r.delivery)
            r.delivery = None
    return out
