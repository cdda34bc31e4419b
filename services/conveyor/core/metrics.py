"""Prometheus metrics: every name and label Conveyor exports. Each process exposes its own
registry (the API on /metrics, the worker and the publisher on their health port); ``conveyor
dev`` shares one, so its /metrics shows all. Type labels come from registered handlers or the
database's job types, so they stay bounded by what operators deploy."""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Sequence
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Queue wait spans milliseconds (a hot queue) to hours (a backlog or a long retry pen).
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class Children:
    """The labelled children of one metric, each looked up once: ``labels()`` validates its
    arguments and takes a lock on every call (~2 us, several times per job on the worker's hot
    path). Bounded like the label values themselves (registered types, outcomes)."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


def observe_many(child: Any, values: Sequence[float]) -> None:
    """``child.observe(v)`` for each of ``values`` (a labelled ``Histogram``), with one lock per
    bucket hit and one for the sum instead of two per value: the worker observes each claimed
    batch's queue waits at once. NaN (no bucket in ``observe``) goes through ``observe``."""
    if any(v != v for v in values):
        for v in values:
            child.observe(v)
        return
    bounds = child._upper_bounds  # prometheus_client's Histogram: the bucket bounds, then +Inf
    for i, n in collections.Counter(bisect.bisect_left(bounds, v) for v in values).items():
        child._buckets[i].inc(n)
    if values:
        child._sum.inc(math.fsum(values))


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        counter = partial(Counter, registry=self.registry)
        gauge = partial(Gauge, registry=self.registry)
        histogram = partial(Histogram, registry=self.registry)
        self.jobs_submitted = counter(
            "conveyor_jobs_submitted", "Jobs accepted by the API", ["type"]
        )
        self.api_errors = counter("conveyor_api_errors", "API error responses", ["status"])
        self.outbox_published = counter(
            "conveyor_outbox_published", "Outbox rows published and confirmed", ["destination"]
        )
        self.outbox_failed = counter(
            "conveyor_outbox_publish_failed", "Outbox rows whose publish failed (row kept)"
        )
        self.jobs_finished = counter(
            "conveyor_jobs_finished", "Attempts finished, by outcome", ["type", "outcome"]
        )
        self.messages_dropped = counter(
            "conveyor_messages_dropped",
            "Deliveries acknowledged without running (duplicate, finished, unknown job)",
            ["reason"],
        )
        self.loop_blocked = counter(
            "conveyor_worker_loop_blocked",
            "Attempts of an async handler preempted for blocking the worker's event loop",
            ["type"],
        )
        self.released_claimed = counter(
            "conveyor_worker_released_claimed",
            "Workflow jobs a worker claimed in the transaction that released them, and ran "
            "without a broker message",
            ["type"],
        )
        self.messages_rejected = counter(
            "conveyor_messages_rejected", "Deliveries rejected to the dead-letter queue", ["reason"]
        )
        self.jobs_admitted = counter(
            "conveyor_jobs_admitted",
            "Jobs of limited or partitioned types admitted (made PENDING with an outbox row)",
            ["type"],
        )
        self.fenced_writes = counter(
            "conveyor_fenced_writes", "State writes refused because the attempt was superseded"
        )
        self.maintenance = counter(
            "conveyor_maintenance", "Jobs touched by maintenance duties", ["duty"]
        )
        self.declare_failed = counter(
            "conveyor_broker_declare_failed",
            "Queue or pen declarations the broker refused (the rows wait in the outbox)",
            ["queue", "reason"],
        )
        self.queue_depth_failed = counter(
            "conveyor_queue_depth_failed",
            "Queue depth reads that failed (the reconciler skipped the type for that pass)",
            ["type"],
        )
        self.reconciled = counter(
            "conveyor_reconciled", "Jobs re-published by the reconciler (message lost)", ["type"]
        )
        self.job_duration = histogram("conveyor_job_duration_seconds", "Handler run time", ["type"])
        self.job_wait = histogram(
            "conveyor_job_wait_seconds",
            "Queue wait of an attempt: due (run_at or creation) to claim",
            ["type"],
            buckets=WAIT_BUCKETS,
        )
        # per job on the worker: children looked up once
        self.job_duration_of = Children(self.job_duration)
        self.job_wait_of = Children(self.job_wait)
        self.jobs_finished_of = Children(self.jobs_finished)
        # Gauges refreshed from the database and the broker every few seconds
        # (``maintenance.gauges``), never by a query per scrape; a labelled one has no sample
        # until a refresh sets one, and those without labels are in ``maintenance_gauges``.
        self.jobs = gauge(
            "conveyor_jobs",
            "Jobs by type and status (COMPLETED and CANCELLED are not counted: "
            "see conveyor_jobs_finished_total)",
            ["type", "status"],
        )
        self.jobs_admissible = gauge(
            "conveyor_jobs_admissible",
            "Jobs waiting for admission that their limits would admit if the fleet had room "
            "(a backlog for autoscaling; jobs held by a limit are not in it)",
            ["type"],
        )
        self.jobs_estimated = gauge(
            "conveyor_jobs_estimated",
            "1 where conveyor_jobs{type,status} is the planner's "
            "estimate (above the exact-count cap), 0 where it is an exact count",
            ["type", "status"],
        )
        self.queue_messages = gauge(
            "conveyor_queue_messages",
            "Messages in a queue: ready (from the broker) and unacked (held by this worker)",
            ["queue", "state"],
        )
        self.workflows = gauge(
            "conveyor_workflows",
            "Workflows by status (finished ones until retention deletes them; above the "
            "exact-count cap, the planner's estimate)",
            ["status"],
        )
        self.workflows_estimated = gauge(
            "conveyor_workflows_estimated",
            "1 where conveyor_workflows{status} is the planner's estimate (above the "
            "exact-count cap), 0 where it is an exact count",
            ["status"],
        )
        self._maintenance: MaintenanceGauges | None = None

    def maintenance_gauges(self) -> MaintenanceGauges:
        """The gauges without labels that only maintenance computes, registered at the first
        call: by ``maintenance.gauges`` once it has read their values. A process that never
        computes them exports none (a Gauge exports 0 from its creation, and the API's and the
        workers' 0 had hidden the outbox's lag and kept ``absent()`` alerts quiet)."""
        if self._maintenance is None:
            self._maintenance = MaintenanceGauges(self.registry)
        return self._maintenance

    def forget_maintenance(self) -> None:
        """Stop exporting what maintenance computes, when this process stops computing it (the
        duties moved to another process): a last value left behind would read as current."""
        if self._maintenance is not None:
            for gauge in vars(self._maintenance).values():
                self.registry.unregister(gauge)
            self._maintenance = None
        for labelled in (self.jobs, self.jobs_estimated, self.workflows, self.workflows_estimated):
            labelled.clear()


class MaintenanceGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        gauge = partial(Gauge, registry=registry)
        self.outbox_rows = gauge("conveyor_outbox_rows", "Outbox rows waiting to be published")
        self.outbox_lag = gauge(
            "conveyor_outbox_lag_seconds", "Age of the oldest unpublished outbox row"
        )
        self.leases_expired = gauge(
            "conveyor_leases_expired",
            "Running jobs whose lease expired and that maintenance "
            "has not recovered yet (the stuck_jobs view)",
        )
