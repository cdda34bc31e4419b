"""Typed rows and batched items: what store functions take and return."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from ..core.jobs import Status
from ..core.limits import Partitioning


@dataclass(frozen=True, slots=True)
class Debounce:
    """A debounced submit: it folds into the job of its key still waiting, if any."""

    seconds: float  # the job starts this long after the last submit ...
    max_seconds: float  # ... but no later than this long after the first
    key: str | None = None  # default: the partition key, else the type


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job ready to insert (see ``conveyor.jobs.spec.build_job``)."""

    id: uuid.UUID
    job_type: str
    payload_json: str
    priority: int
    max_retries: int | None = None
    timeout_seconds: float | None = None
    run_at: datetime | None = None
    delay_seconds: float | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    meta_json: str | None = None  # a JSON object, or None (the hot path's insert has no meta)
    unique_key: str | None = None  # held by this job for ``unique_for`` seconds (store/jobs.py)
    unique_for: float | None = None
    partition_key: str | None = None  # given at submit (else the type's fields decide)
    debounce: Debounce | None = None


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as operators and the API see it."""

    id: uuid.UUID
    job_type: str
    status: Status
    priority: int
    payload: dict[str, Any]
    result: Any
    max_retries: int | None
    timeout_seconds: float | None
    retry_count: int
    attempts: int
    last_error: str | None
    run_at: datetime | None
    lease_expires_at: datetime | None
    worker_id: str | None
    cancel_requested: bool
    idempotency_key: str | None
    request_hash: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: dict[str, Any] | None = None  # {"percent", "message", "updated_at"}
    meta: dict[str, Any] | None = None
    workflow_id: uuid.UUID | None = None  # a workflow job's (read by job_get and job pages)
    depends_on: tuple[uuid.UUID, ...] = ()  # the ids of the jobs it waits for
    partition_key: str | None = None  # '' for a type limited as a whole (admission.sql)
    waiting_for: str | None = None  # why it waits (read by job_get only)

    @classmethod
    def from_record(cls, r: Any) -> JobRow:
        result, progress, meta = r["result"], r.get("progress"), r.get("meta")
        return cls(
            r["id"],
            r["job_type"],
            Status(r["status"]),
            r["priority"],
            orjson.loads(r["payload"]),
            None if result is None else orjson.loads(result),
            r["max_retries"],
            r["timeout_seconds"],
            r["retry_count"],
            r["attempts"],
            r["last_error"],
            r["run_at"],
            r["lease_expires_at"],
            r["worker_id"],
            r["cancel_requested"],
            r["idempotency_key"],
            r["request_hash"],
            r["created_at"],
            r["updated_at"],
            r["started_at"],
            r["finished_at"],
            None if progress is None else orjson.loads(progress),
            None if meta is None else orjson.loads(meta),
            r.get("workflow_id"),
            tuple(r.get("depends_on") or ()),
            r.get("partition_key"),
            r.get("waiting_for"),
        )


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker has just claimed (its attempt already counted)."""

    id: uuid.UUID
    job_type: str
    payload: dict[str, Any]
    priority: int
    attempts: int
    retry_count: int
    max_retries: int
    timeout_seconds: float | None
    wait_seconds: float = 0.0  # due (run_at, or created_at) → this claim
    trace_context: str | None = None  # the submit's traceparent (tracing)
    meta: dict[str, Any] | None = None
    workflow_id: uuid.UUID | None = None
    # a workflow job's dependencies: key -> {"status", "result"}
    parents: dict[str, dict[str, Any]] | None = None
    admitted: bool = False  # under admission: its end frees a slot (admission.sql)

    @classmethod
    def from_record(cls, r: Any) -> ClaimedJob:
        """A row of a claim statement (``job_claim_many``, ``job_claim_released``)."""
        meta, parents = r["meta"], r["parents"]
        return cls(
            r["id"],
            r["job_type"],
            orjson.loads(r["payload"]),
            r["priority"],
            r["attempts"],
            r["retry_count"],
            r["max_retries"],
            r["timeout_seconds"],
            r["wait"],
            r["trace_context"],
            None if meta is None else orjson.loads(meta),
            r["workflow_id"],
            None if parents is None else orjson.loads(parents),
            r["admitted"],
        )


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job: the fencing token of every write after a claim."""

    job_id: uuid.UUID
    attempt: int


@dataclass(frozen=True, slots=True)
class Completion:
    job_id: uuid.UUID
    attempt: int
    result_json: str | None


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt. ``delay`` None: retries exhausted (FAILED + dead letter); otherwise the
    retry's delay in seconds (0: straight back to the work queue). ``consume``: whether it used up
    a retry (``Retry(delay)`` does not)."""

    job_id: uuid.UUID
    attempt: int
    error: str | None
    delay: int | None
    consume: bool = True


@dataclass(frozen=True, slots=True)
class JobStatus:
    id: uuid.UUID
    status: Status
    job_type: str = ""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A message to publish: ``destination`` work (the type's queue), retry (the holding pen of
    ``delay_seconds``) or dead (the dead-letter queue, with ``error`` and the ``attempt`` that
    failed, which fences a redrive from the queue: ``job_redrive_failed``)."""

    id: int
    job_id: uuid.UUID
    job_type: str
    priority: int
    destination: str
    delay_seconds: int | None
    error: str | None
    attempt: int | None = None
    trace_context: str | None = None  # read only by the traced take (tracing on)

    @classmethod
    def from_record(cls, r: Any, *, traced: bool = False) -> OutboxRow:
        """A row of ``outbox_take_batch`` (``traced``: of the traced take)."""
        return cls(
            r["id"],
            r["job_id"],
            r["job_type"],
            r["priority"],
            r["destination"],
            r["delay_seconds"],
            r["error"],
            r["attempt"],
            r["trace_context"] if traced else None,
        )


@dataclass(frozen=True, slots=True)
class JobTypeDefaults:
    """A job type as a worker registers it: its handler's defaults."""

    name: str
    max_retries: int | None = None
    timeout_seconds: float | None = None
    retry_delays: tuple[int, ...] | None = None
    concurrency: int | None = None  # the handler's fleet-wide limits
    rate_limit: int | None = None
    rate_period: int | None = None
    partition: Partitioning | None = None  # its partition settings (admission)


@dataclass(frozen=True, slots=True)
class JobType:
    name: str
    max_retries: int | None
    timeout_seconds: float | None
    retry_delays: tuple[int, ...]
    first_seen: datetime
    last_seen: datetime
    paused: bool = False
    concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: int | None = None
    limits_set_at: datetime | None = None  # an operator's limits (None: the handler's)
    running: int = 0  # IN_PROGRESS now
    partition: Partitioning | None = None


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One partition key of a type as operators see it (GET /types/{type}/partitions)."""

    key: str
    waiting: int  # WAITING
    admitted: int  # PENDING: admitted, not started
    running: int  # IN_PROGRESS
    since: datetime | None  # its oldest job waiting for admission waits since (None: none)
    oldest_wait_seconds: float | None
    concurrency: int | None  # the operator's override (None: the type's)
    paused: bool  # the operator's pause of this key
    limit: int | None  # the key's concurrency as admission applies it (None: none)

    @classmethod
    def of(cls, r: Any) -> PartitionRow:
        return cls(
            r["key"],
            r["waiting"],
            r["admitted"],
            r["running"],
            r["since"],
            r["oldest_wait_seconds"],
            r["concurrency"],
            r["paused"],
            r["key_limit"],
        )


@dataclass(frozen=True, slots=True)
class TypeControl:
    """What a worker needs to know about a type: whether to consume its queue."""

    name: str
    paused: bool


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One attempt of a job (``GET /jobs/{id}/attempts``); ``outcome`` None while it runs."""

    attempt: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str | None
    error: str | None
    duration_seconds: float | None
