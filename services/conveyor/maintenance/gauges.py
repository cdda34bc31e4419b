"""Gauges from the database and the broker, refreshed every few seconds by one process (the
sweeper, wherever it runs), never by a query per scrape: jobs by type and status, the outbox's
size and lag, running jobs whose lease expired (the ``stuck_jobs`` view), workflows by status,
and each work queue's ready messages.

Jobs by type and status are counted exactly up to ``exact_up_to`` (1,000) per pair, with an
index-only scan that stops there; a pair at the cap takes the planner's estimate instead (never
less than the cap) and ``conveyor_jobs_estimated`` is 1 for it. So a refresh reads at most the
cap per pair (~18,000 index entries at 10 million jobs instead of the 600,000 live and FAILED
ones: docs/performance.md), and small counts, where an alert's threshold usually is, stay exact."""

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
from ..store.schema import WORKFLOW_STATUSES
from ..store.stats import COUNTED_STATUSES

log = logging.getLogger("conveyor.gauges")

QueueDepth = Callable[[str], Awaitable[int]]
INTERVAL = 5.0
EXACT_UP_TO = 1000


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
        exact_up_to: int = EXACT_UP_TO,
    ) -> None:
        self.metrics = metrics
        self.store = store
        self.pool = pool
        self.topology = topology
        self.queue_depth = queue_depth
        self.interval = interval
        self.exact_up_to = exact_up_to
        self._seen: set[tuple[str, str]] = set()
        self._ready: set[str] = set()  # the queues whose "ready" depth it set

    async def refresh_once(self) -> None:
        """One step: read the counts and set the gauges. A (type, status) that emptied is set to
        0, so its series drops to zero instead of freezing at its last value; every registered
        type has a series per counted status (0 included) from the first refresh, so a fresh
        install's panels show 0 rather than "no data" and ``absent()`` alerts stay quiet."""
        cap = self.exact_up_to
        async with self.pool.acquire() as conn:
            now = await self.store.job_counts_capped(conn, cap)
            estimated = {key for key, n in now.items() if n >= cap}
            for key in sorted(estimated):
                now[key] = max(cap, await self.store.job_count_estimate(conn, *key))
            rows, lag = await self.store.outbox_stats(conn)
            stuck = await self.store.job_stuck_count(conn)
            registered = await self.store.job_type_names(conn)
            workflows = await self.store.workflow_status_counts(conn, cap)
            flows_estimated = {status for status, n in workflows.items() if n >= cap}
            for status in sorted(flows_estimated):
                workflows[status] = max(cap, await self.store.workflow_count_estimate(conn, status))
        zeros = {(t, s) for t in registered for s in COUNTED_STATUSES}
        for key in (self._seen | zeros) - now.keys():
            self.metrics.jobs.labels(*key).set(0)
            self.metrics.jobs_estimated.labels(*key).set(0)
        for key, n in now.items():
            self.metrics.jobs.labels(*key).set(n)
            self.metrics.jobs_estimated.labels(*key).set(1 if key in estimated else 0)
        self._seen |= now.keys()
        computed = self.metrics.maintenance_gauges()  # registered now: never a 0 unread
        computed.outbox_rows.set(rows)
        computed.outbox_lag.set(lag)
        computed.leases_expired.set(stuck)
        for status in WORKFLOW_STATUSES:
            self.metrics.workflows.labels(status).set(workflows.get(status, 0))
            self.metrics.workflows_estimated.labels(status).set(
                1 if status in flows_estimated else 0
            )
        if self.queue_depth is not None:
            for job_type in sorted({t for t, _ in self._seen}):
                queue = self.topology.work_queue(job_type)
                self.metrics.queue_messages.labels(queue, "ready").set(
                    await self.queue_depth(job_type)
                )
                self._ready.add(queue)

    def forget(self) -> None:
        """This process stops refreshing the gauges: they go from its /metrics (a worker's own
        ``unacked`` series stay)."""
        for queue in self._ready:
            self.metrics.queue_messages.remove(queue, "ready")
        self._ready.clear()
        self._seen.clear()
        self.metrics.forget_maintenance()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.refresh_once()
            except Exception as exc:
                event(log, "gauges_failed", logging.WARNING, error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
