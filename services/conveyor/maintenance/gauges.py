"""Gauges from the database and the broker, refreshed every few seconds by one process (the
publisher's maintenance, or ``conveyor dev``), never by a query per scrape: jobs by type and
status (the ``backlog`` view: an index skip scan), the outbox's size and lag, running jobs whose
lease expired (the ``stuck_jobs`` view), and each work queue's ready messages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..broker.topology import Topology
from ..core.logging import event
from ..core.metrics import Metrics
from ..store import Store

log = logging.getLogger("conveyor.gauges")

QueueDepth = Callable[[str], Awaitable[int]]
INTERVAL = 5.0


class Gauges:
    def __init__(
        self,
        metrics: Metrics,
        store: Store,
        pool: Any,
        topology: Topology,
        *,
        queue_depth: QueueDepth | None = None,
        interval: float = INTERVAL,
    ) -> None:
        self.metrics = metrics
        self.store = store
        self.pool = pool
        self.topology = topology
        self.queue_depth = queue_depth
        self.interval = interval
        self._seen: set[tuple[str, str]] = set()

    async def refresh_once(self) -> None:
        """One step: read the counts and set the gauges. A (type, status) that emptied is set to
        0, so its series drops to zero instead of freezing at its last value."""
        async with self.pool.acquire() as conn:
            backlog = await self.store.job_backlog(conn)
            rows, lag = await self.store.outbox_stats(conn)
            stuck = await self.store.job_stuck_count(conn)
        now = {(b.job_type, b.status): b.count for b in backlog}
        for key in self._seen - now.keys():
            self.metrics.jobs.labels(*key).set(0)
        for key, n in now.items():
            self.metrics.jobs.labels(*key).set(n)
        self._seen |= now.keys()
        self.metrics.outbox_rows.set(rows)
        self.metrics.outbox_lag.set(lag)
        self.metrics.leases_expired.set(stuck)
        if self.queue_depth is not None:
            for job_type in sorted({t for t, _ in self._seen}):
                queue = self.topology.work_queue(job_type)
                self.metrics.queue_messages.labels(queue, "ready").set(
                    await self.queue_depth(job_type)
                )

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.refresh_once()
            except Exception as exc:
                event(log, "gauges_failed", logging.WARNING, error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
