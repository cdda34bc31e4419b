"""The consumer for paused and limited types (``store/attempts.py`` has the SQL).

``LimitedConsumer`` is the plain ``Consumer`` as long as none of the worker's types is
controlled (``TypeControls.controlled`` empty: the claim's hot path is untouched). Otherwise a
batch is split: deliveries of controlled types are claimed by one statement that locks their
type rows for its own duration and claims at most what the limits allow; the rest are *held*
(acknowledged here, no retry consumed) instead of being reported as dropped duplicates. A job
held for a full concurrency limit stays in this worker's hand (``waiting``; its lease renewed
with the inbox's) and is claimed again as soon as one of this worker's jobs finishes, or after a
short backoff for slots freed elsewhere. A job held in another worker's hand for over
``STEAL_AFTER`` comes first: fresh deliveries leave it their slot (and wake this hand), and the
hand's claim takes it before its own (``steal``); a worker frozen with jobs in hand loses them
to the others' claims while its holds last, and to the lease sweep after. A full
hand (the type's limit, at least ``HOLD_IN_HAND``) stops consuming the type's queue until half
of it has run, so the rest of a backlog stays in the queue for the other workers instead of all
of it in one worker's hand; the others (paused, rate window, in flight beyond a full hand) go
back through a holding pen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from ..broker.consume import Delivery
from ..broker.wire import MalformedMessage, decode
from ..core.logging import event
from ..store import ClaimedJob
from .consumer import Consumer
from .controls import TypeControls

log = logging.getLogger("conveyor.worker")

HOLD_IN_HAND = 4  # at least, jobs of a type held in a worker's hand (else: its limit)
RETRY_MIN, RETRY_MAX = 0.05, 1.0  # backoff of a claim again with nothing freed locally
# another worker's claim takes a job held longer than this in a hand (its holder's retries,
# at most RETRY_MAX apart, got it no slot: the slots go elsewhere, or the holder is frozen)
STEAL_AFTER = 2 * RETRY_MAX


class LimitedConsumer(Consumer):
    def __init__(self, *args: Any, controls: TypeControls, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.controls = controls
        self._type_of: dict[uuid.UUID, str] = {}
        self._held: set[uuid.UUID] = set()
        self.held_total = 0
        self.waiting: dict[str, dict[uuid.UUID, None]] = {}  # held in hand, per type
        self.freed = asyncio.Event()  # one of this worker's jobs finished
        self.full: set[str] = set()  # types not consumed while their hand is full
        self._stopped: set[str] = set()  # of these, the ones whose consumer was stopped
        self._switching = asyncio.Lock()
        self._claiming: asyncio.Future[int] | None = None

    def _cap(self, job_type: str) -> int:
        c = self.controls.by_type.get(job_type)
        return max(HOLD_IN_HAND, c.concurrency if c and c.concurrency else 0)

    async def _regulate(self) -> None:
        """Stop consuming a type whose hand is full; consume it again once half of it ran. A
        switch that fails (the broker's channel closed) stays due and is tried again by the
        next call: the waiting loop makes one at least every ``RETRY_MAX`` while one is due."""
        for t, hand in self.waiting.items():
            if t not in self.full and len(hand) >= self._cap(t):
                self.full.add(t)
            elif t in self.full and len(hand) <= self._cap(t) // 2:
                self.full.discard(t)
        async with self._switching:  # one switch at a time: two resumes make two consumers
            for t in sorted(self.full ^ self._stopped):
                stop = t in self.full
                if not stop and t in self.controls.paused:
                    self._stopped.discard(t)  # an operator's pause: stays stopped
                    continue
                try:
                    await self.controls.on_pause(t, stop)
                except Exception as exc:
                    event(
                        log,
                        "hand_switch_failed",
                        logging.WARNING,
                        type=t,
                        stop=stop,
                        error=repr(exc),
                    )
                    continue
                if stop:
                    self._stopped.add(t)
                else:
                    self._stopped.discard(t)

    async def run(self) -> None:
        await asyncio.gather(super().run(), self._run_waiting())

    async def step(self) -> int:
        if self.controls.controlled:
            # a delivery first, then a slot: the plain step sits on a slot while it waits for a
            # delivery, and a worker whose hand is full (its type no longer consumed) would keep
            # its last slot from the jobs in its hand
            await self.inbox.wait()
        return await super().step()

    async def _run_waiting(self) -> None:
        delay = RETRY_MAX
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.freed.wait(), delay)
            self.freed.clear()  # a job finishing from here on wakes the next wait at once
            if self.full != self._stopped:  # a switch failed: try it again
                await self._regulate()
            if not any(self.waiting.values()):
                delay = RETRY_MAX
                continue
            # shielded, as a batch's claim: a drain waits for it (``hand_back_waiting``) instead
            # of cutting it between the claim's commit and the handlers' start
            self._claiming = asyncio.ensure_future(self.claim_waiting())
            started = await asyncio.shield(self._claiming)
            delay = RETRY_MIN if started else min(delay * 2, RETRY_MAX)

    async def claim_waiting(self) -> int:
        """One step: claim again the jobs held in hand, as many as this worker has free slots
        for (at least one: waits for it). Returns how many started."""
        await self.slots.acquire()
        got = 1
        total = sum(len(w) for w in self.waiting.values())
        while got < total and not self.slots.locked():
            await self.slots.acquire()
            got += 1
        type_of = {i: t for t, w in self.waiting.items() for i in w}
        ids = list(type_of)[:got]
        started = 0
        try:
            if ids and not self.stopping:
                # ``steal``: the slots go to the jobs first in line in any hand, this one's or
                # another worker's (that worker's next claim finds them taken)
                got_back = await self._claim_controlled(ids, type_of, steal=True)
                rows, held = got_back or ([], {})
                for i in ids:  # claimed, gone, or sent to a pen: no longer in hand
                    if held.get(i) != 0:
                        self.waiting.get(type_of[i], {}).pop(i, None)
                for row in rows:
                    self._claimed += 1
                    started += 1
                    if row.id not in type_of:
                        event(log, "job_taken_from_hand", logging.DEBUG, job_id=str(row.id))
                    self.start(row, None)  # its delivery was acknowledged when it was held
                await self._regulate()
        finally:
            for _ in range(got - started):
                self.slots.release()
        return started

    async def touch_waiting(self) -> None:
        await self._touch(self.inbox.job_ids() + [i for w in self.waiting.values() for i in w])

    async def hand_back_waiting(self) -> int:
        """The drain: the inbox's deliveries back to their queue, the jobs held in hand back
        through a pen (best effort: a hold that is not released runs out within a lease)."""
        n = await super().hand_back_waiting()
        if self._claiming is not None and not self._claiming.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._claiming), 10)
        ids = [i for w in self.waiting.values() for i in w]
        self.waiting.clear()
        if ids:
            with contextlib.suppress(Exception):
                async with self.pool.acquire() as conn:
                    await self.store.job_release_held(conn, ids)
                    await self.store.outbox_notify(conn)
        return n + len(ids)

    async def _process(self, batch: list[tuple[Delivery, uuid.UUID | None]]) -> None:
        # the one path every batch takes (``step`` and ``process_batch`` both end here)
        if not self.controls.controlled:
            await super()._process(batch)
            return
        for d, job_id in batch:
            if job_id is None:
                continue  # the plain path rejects it
            try:
                m = decode(d.body)
            except MalformedMessage:
                continue
            self._type_of[m.job_id] = m.job_type
        try:
            await super()._process(batch)
        finally:
            self._type_of.clear()
            self._held.clear()

    async def _claim(self, ids: list[uuid.UUID]) -> list[ClaimedJob] | None:
        controlled = self.controls.controlled
        mine = [i for i in ids if self._type_of.get(i) in controlled]
        if not mine:
            return await super()._claim(ids)
        plain = [i for i in ids if self._type_of.get(i) not in controlled]
        rows: list[ClaimedJob] = []
        if plain:
            got = await super()._claim(plain)
            if got is None:
                return None
            rows = got
        more = await self._claim_controlled(mine, self._type_of)
        if more is None:
            return None
        self._held.update(more[1])
        if 0 in more[1].values():
            # held in hand: a slot may have been left to another hand's job, which this
            # worker's hand claim takes at once (work-conserving) rather than that worker's
            # backoff
            self.freed.set()
            await self._regulate()
        return rows + more[0]

    async def _claim_controlled(
        self, ids: list[uuid.UUID], type_of: dict[uuid.UUID, str], *, steal: bool = False
    ) -> tuple[list[ClaimedJob], dict[uuid.UUID, int]] | None:
        """Claim ``ids`` (of controlled types): the claimed jobs and the held ones (id → pen
        seconds, 0: now in ``waiting``); None when the drain stops a claim that keeps failing.
        ``steal`` (the hand's claim): jobs held in other hands first in line are claimed
        instead of some of ``ids``, never more jobs than ``ids``."""
        types = sorted({type_of[i] for i in ids})
        room = {t: self._cap(t) - len(self.waiting.get(t, ())) for t in types}
        for i in ids:  # already in hand: claimed again, or held again in the same place
            if i in self.waiting.get(type_of[i], ()):
                room[type_of[i]] += 1

        async def claim(conn: Any) -> tuple[list[ClaimedJob], dict[uuid.UUID, int]]:
            # one statement, no transaction: the type rows are locked only while it runs
            rows, held = await self.store.job_claim_controlled(
                conn,
                ids,
                lease_seconds=self.visibility_timeout,
                worker_id=self.worker_id,
                types=types,
                handler_defaults=self.handler_defaults,
                default_max_retries=self.default_max_retries,
                room=room,
                steal=steal,
                steal_after=STEAL_AFTER,
            )
            if any(held.values()):
                await self.store.outbox_notify(conn)
            return rows, held

        got = await self._retrying(claim)
        if got is None:
            return None
        rows, held = got
        for job_id, pen in held.items():
            job_type = type_of.get(job_id, "")
            if pen == 0:
                hand = self.waiting.setdefault(job_type, {})
                if job_id in hand:
                    continue  # held again where it was
                hand[job_id] = None
            self.held_total += 1
            self.metrics.jobs_held.labels(job_type).inc()
            event(log, "job_held", logging.DEBUG, job_id=str(job_id), type=job_type, pen=pen)
        return rows, held

    async def _explain_dropped(self, ids: list[uuid.UUID]) -> None:
        """Held jobs were acknowledged with the duplicates; only the others are dropped."""
        rest = [i for i in ids if i not in self._held]
        if rest:
            await super()._explain_dropped(rest)
