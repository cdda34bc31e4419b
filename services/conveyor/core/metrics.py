"""Prometheus metrics. Each process exposes its own (the API on /metrics, the worker and the
publisher on their health port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.jobs_submitted = Counter(
            "conveyor_jobs_submitted", "Jobs accepted by the API", ["type"], registry=r
        )
        self.api_errors = Counter(
            "conveyor_api_errors", "API error responses", ["status"], registry=r
        )
        self.outbox_published = Counter(
            "conveyor_outbox_published", "Outbox rows published and confirmed", ["destination"],
            registry=r,
        )  # fmt: skip
        self.outbox_failed = Counter(
            "conveyor_outbox_publish_failed", "Outbox rows whose publish failed (row kept)",
            registry=r,
        )  # fmt: skip
        self.jobs_finished = Counter(
            "conveyor_jobs_finished", "Attempts finished by outcome", ["type", "outcome"],
            registry=r,
        )  # fmt: skip
        self.messages_dropped = Counter(
            "conveyor_messages_dropped",
            "Deliveries acknowledged without running (duplicate, finished, unknown job)",
            ["reason"],
            registry=r,
        )
        self.messages_dead_lettered = Counter(
            "conveyor_messages_dead_lettered", "Malformed deliveries rejected to the DLQ",
            registry=r,
        )  # fmt: skip
        self.fenced_writes = Counter(
            "conveyor_fenced_writes", "State writes refused because the attempt was superseded",
            registry=r,
        )  # fmt: skip
        self.maintenance = Counter(
            "conveyor_maintenance", "Jobs touched by maintenance duties", ["duty"], registry=r
        )
        self.declare_failed = Counter(
            "conveyor_broker_declare_failed",
            "Queue or pen declarations the broker refused (the rows wait in the outbox)",
            ["queue", "reason"],
            registry=r,
        )
        self.queue_depth_failed = Counter(
            "conveyor_queue_depth_failed",
            "Queue depth reads that failed (the reconciler skipped the type for that pass)",
            ["type"],
            registry=r,
        )
        self.job_duration = Histogram(
            "conveyor_job_duration_seconds", "Handler run time", ["type"], registry=r
        )
