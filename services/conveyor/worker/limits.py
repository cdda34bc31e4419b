"""The consumer for paused and limited types (``store/controls.py`` has the SQL).

``LimitedConsumer`` is the plain ``Consumer`` as long as none of the worker's types is
controlled (``TypeControls.controlled`` empty: the claim's hot path is untouched). Otherwise a
batch is split: deliveries of controlled types are claimed in one transaction that locks their
type rows and claims at most what the limits allow; the rest are *held* (acknowledged here, sent
back through a holding pen by an outbox row written in the same transaction, no retry
consumed) instead of being reported as dropped duplicates.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from ..broker.consume import Delivery
from ..broker.wire import MalformedMessage, decode
from ..core.backoff import Backoff
from ..core.logging import event
from ..store import ClaimedJob
from .consumer import Consumer
from .controls import TypeControls

log = logging.getLogger("conveyor.worker")


class LimitedConsumer(Consumer):
    def __init__(self, *args: Any, controls: TypeControls, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.controls = controls
        self._type_of: dict[uuid.UUID, str] = {}
        self._held: set[uuid.UUID] = set()
        self.held_total = 0

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
        more = await self._claim_controlled(mine, sorted({self._type_of[i] for i in mine}))
        return None if more is None else rows + more

    async def _claim_controlled(
        self, ids: list[uuid.UUID], types: list[str]
    ) -> list[ClaimedJob] | None:
        backoff = Backoff()
        while True:
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    await self.store.type_lock_many(conn, types)
                    rows, held = await self.store.job_claim_controlled(
                        conn, ids, lease_seconds=self.visibility_timeout,
                        worker_id=self.worker_id, types=types,
                        handler_defaults=self.handler_defaults,
                        default_max_retries=self.default_max_retries,
                    )  # fmt: skip
                    if held:
                        await self.store.outbox_notify(conn)
                self._failing_since = None
                break
            except Exception as exc:
                if self.stopping:
                    return None
                if self._failing_since is None:
                    self._failing_since = self.clock()
                delay = backoff.next()
                event(log, "claim_failed", logging.WARNING, error=repr(exc),
                      retry_in=round(delay, 2))  # fmt: skip
                await asyncio.sleep(delay)
        self._held.update(held)
        self.held_total += len(held)
        for job_id, pen in held.items():
            job_type = self._type_of.get(job_id, "")
            self.metrics.jobs_held.labels(job_type).inc()
            event(log, "job_held", logging.DEBUG, job_id=str(job_id), type=job_type,
                  pen=pen)  # fmt: skip
        return rows

    async def _explain_dropped(self, ids: list[uuid.UUID]) -> None:
        """Held jobs were acknowledged with the duplicates; only the others are dropped."""
        rest = [i for i in ids if i not in self._held]
        if rest:
            await super()._explain_dropped(rest)
