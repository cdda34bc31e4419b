"""A worker runs the jobs its own completions released (``completer.py`` explains the write).

The slots: a job released by a batch runs in the slot of a job of that batch, and keeps that
job's broker delivery unacknowledged in its place (``Worker._done``). When nothing waits here for
a slot (no delivery in the inbox, no job held in hand for a limited type), the batch may claim as
many released jobs as it has slots holding a delivery (``reserve``); they free as it commits. So
the worker never runs more than its concurrency, a job released to it never waits for a slot,
and every job it runs still holds one delivery: the prefetch keeps bounding the work in hand (the
broker sends nothing to a worker whose slots are all taken, however many of its jobs it claimed
itself) and a queue-length autoscaler counts the job as an unacked message. A free slot is never
claimed into: the broker may fill it at any moment, and a job claimed there would hold no
delivery, so the broker would send one more job than the worker has slots for, to wait in its
inbox for as long as the claimed job runs. A job run this way whose delivery was acknowledged
early (a long job, ``heartbeater.py``) hands over no delivery, and its slot is not handed over.

What it claims is decided in SQL (``job_claim_released``): its own types, none paused or limited
(a limit is counted by the controlled claim only), highest priority first. A claimed job has no
broker message of its own; if the worker dies, its lease runs out and the sweeper publishes it
again, as for any job whose worker died (the delivery it held comes back to a worker, whose claim
drops it: its job is finished). A completing transaction whose COMMIT gets no answer (the
connection lost as the server committed) may have claimed jobs all the same: the completer's next
try finds them IN_PROGRESS at the attempt it gave them and runs them (``Completer._resolve``). A
worker that is stopping claims none (``claim``), and the worker hands back the ones a batch
claimed before the stop and committed after it (``Worker._done``): started then, they could begin
after the drain's hand-back and be left running when the process ends."""

from __future__ import annotations

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
        own = sum(1 for p in batch if p.running.delivery is not None)
        if own == 0 or not self.quiet():
            return None
        return Followed(own)

    async def claim(self, conn: Any, room: int) -> list[ClaimedJob]:
        if self.stopping():  # the drain has begun: no more work
            return []
        return await self.store.job_claim_released(
            conn,
            room=room,
            lease_seconds=self.lease_seconds,
            worker_id=self.worker_id,
            types=self.types,
            handler_defaults=self.handler_defaults,
            default_max_retries=self.default_max_retries,
        )
