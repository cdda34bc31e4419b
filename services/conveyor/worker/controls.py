"""What a worker knows of the job types' controls, re-read every ``type_refresh_interval``
seconds (one small query per worker, off the claim's path):

- ``known``: every registered type (``job.enqueue`` refuses the others at call time);
- ``paused``: this worker's paused types: ``on_pause(type, paused)`` stops or resumes consuming
  their queue, so their jobs wait in it (PENDING, not delivered, not claimed).

A change made through the API or the CLI therefore takes effect on every worker within one
interval. Limits are not the worker's business: a job of a limited type reaches a worker only once
admitted (``maintenance/admission.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..broker.consume import Subscription
from ..core.logging import event
from ..store import Store, TypeControl

log = logging.getLogger("conveyor.worker")

OnPause = Callable[[str, bool], Awaitable[None]]


def consumer_switch(subscription: Subscription, stopping: Callable[[], bool]) -> OnPause:
    """``on_pause`` for a worker: stop consuming a paused type's queue, consume it again on
    resume (unless the worker is draining)."""

    async def switch(job_type: str, paused: bool) -> None:
        if paused:
            await subscription.pause(job_type)
        elif not stopping():
            await subscription.resume(job_type)

    return switch


class TypeControls:
    def __init__(
        self, pool: Any, store: Store, *, types: list[str], interval: float, on_pause: OnPause
    ) -> None:
        self.pool = pool
        self.store = store
        self.types = set(types)
        self.interval = interval
        self.on_pause = on_pause
        self.known: frozenset[str] = frozenset(types)
        self.paused: frozenset[str] = frozenset()
        self.by_type: dict[str, TypeControl] = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh_once()
            except Exception as exc:  # keep the last view
                event(log, "type_controls_failed", logging.WARNING, error=repr(exc)[:300])

    async def refresh_once(self) -> None:
        """One step: read the controls, then pause or resume consuming what changed."""
        async with self.pool.acquire() as conn:
            rows = await self.store.type_controls(conn)
        self.by_type = {r.name: r for r in rows}
        self.known = frozenset(self.by_type) | self.types
        mine = [r for r in rows if r.name in self.types]
        paused = frozenset(r.name for r in mine if r.paused)
        for t in sorted(paused ^ self.paused):
            event(log, "type_paused" if t in paused else "type_resumed", type=t)
            await self.on_pause(t, t in paused)
            # recorded once done: a switch that fails (the broker's channel closed) is a change
            # again at the next refresh, instead of a type never consumed again
            self.paused = self.paused ^ {t}
