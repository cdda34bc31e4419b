"""A worker runs the jobs its own completions released (``completer.py`` explains the write).

The slots: when a batch completing workflow jobs is about to be written, its own slots count
if nothing waits for a slot here (no delivery in the inbox, no job held in hand for a limited
type), since they free as it commits (``reserve``). Inside its transaction, right before the
claim, every free slot is set aside (``take``); when the transaction ends, committed or not, the
ones no claimed job took go back (``trim``). After the commit, the claimed jobs take the slots
set aside first, then the batch's; the rest are released. So the worker never runs more than its
concurrency, and a job released to it never waits for a slot. Deliveries that arrive during the
claim wait for it (one statement longer); a wait before it (a follow-up's key another transaction
holds, an outage's backoff, a large result's turn for a connection) holds no free slot.

What it claims is decided in SQL (``job_claim_released``): its own types, none paused or limited
(a limit is counted by the controlled claim only), highest priority first. A claimed job has no
broker message; if the worker dies, its lease runs out and the sweeper publishes it again, as for
any job whose worker died. A worker that is stopping claims none (``take``), and the worker hands
back the ones a batch claimed before the stop and committed after it (``Worker._done``): started
then, they could begin after the drain's hand-back and be left running when the process ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..store import ClaimedJob, Store
from ..store.attempts import HandlerDefaults
from .completer import Followed, Pending
from .outcomes import Kind


class Follower:
    def __init__(
        self,
        store: Store,
        slots: asyncio.Semaphore,
        *,
        enabled: bool,
        quiet: Callable[[], bool],
        stopping: Callable[[], bool],
        worker_id: str,
        types: list[str],
        handler_defaults: HandlerDefaults,
        lease_seconds: float,
        default_max_retries: int,
    ) -> None:
        self.store = store
        self.slots = slots
        self.enabled = enabled
        self.quiet = quiet  # nothing waits here for a slot
        self.stopping = stopping
        self.worker_id = worker_id
        self.types = types
        self.handler_defaults = handler_defaults
        self.lease_seconds = lease_seconds
        self.default_max_retries = default_max_retries

    async def reserve(self, batch: list[Pending]) -> Followed | None:
        if not self.enabled or self.stopping():
            return None
        if not any(
            p.outcome.kind is Kind.COMPLETE and p.running.job.workflow_id is not None for p in batch
        ):
            return None
        own = len(batch) if self.quiet() else 0
        if own == 0 and self.slots.locked():
            return None  # no slot to claim with now: no transaction for it
        return Followed(own)

    async def take(self, followed: Followed) -> int:
        if self.stopping():  # the drain has begun: claim nothing more
            return 0
        while not self.slots.locked():
            await self.slots.acquire()  # returns at once: a slot is free and nobody waits
            followed.reserved += 1
        return followed.reserved + followed.own - len(followed.jobs)

    def trim(self, followed: Followed) -> None:
        used = min(len(followed.jobs), followed.reserved)
        for _ in range(followed.reserved - used):
            self.slots.release()
        followed.reserved = used

    def unreserve(self, followed: Followed) -> None:
        for _ in range(followed.reserved):
            self.slots.release()
        followed.reserved = 0

    async def claim(self, conn: Any, room: int) -> list[ClaimedJob]:
        return await self.store.job_claim_released(
            conn,
            room=room,
            lease_seconds=self.lease_seconds,
            worker_id=self.worker_id,
            types=self.types,
            handler_defaults=self.handler_defaults,
            default_max_retries=self.default_max_retries,
        )

    def settle(self, followed: Followed) -> int:
        """After the commit: release the reserved slots no claimed job took; returns how many
        of the batch's own slots the claimed jobs take over."""
        used = min(len(followed.jobs), followed.reserved)
        for _ in range(followed.reserved - used):
            self.slots.release()
        return len(followed.jobs) - used
