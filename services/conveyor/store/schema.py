"""SQLAlchemy Core tables: the single source of the schema. Alembic migrations must match it
(``tests/integration/test_schema.py`` diffs a migrated database against this metadata). Every
table, type and index lives in one PostgreSQL schema, ``CONVEYOR_DB_SCHEMA`` (default
``conveyor``), beside the application's own tables; so does Alembic's version table."""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from ..core.jobs import Status
from .registry import check_schema
from .schema_workflows import define_workflows

DEFAULT_SCHEMA = "conveyor"
VERSION_TABLE = "alembic_version"


def outbox_channel(schema: str) -> str:
    """The NOTIFY channel that wakes the publishers of the install in ``schema``."""
    return f"{schema}_outbox"


@functools.cache
def metadata_for(schema: str = DEFAULT_SCHEMA) -> sa.MetaData:
    """The tables of an install in ``schema`` (built once per schema)."""
    check_schema(schema)
    metadata = sa.MetaData(schema=schema)
    _define(metadata, schema)
    return metadata


def _define(metadata: sa.MetaData, schema: str) -> None:
    job_status = pg.ENUM(
        *[s.value for s in Status],
        name="job_status",
        schema=schema,
        metadata=metadata,
        create_type=False,
    )
    jobs = sa.Table(
        "jobs",
        metadata,
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("status", job_status, nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("payload", pg.JSONB(), nullable=False),
        sa.Column("result", pg.JSONB(), nullable=True),
        # NULL until the first claim: then the handler's default (or the global one) is written.
        sa.Column("max_retries", sa.Integer(), nullable=True),
        sa.Column("timeout_seconds", sa.Float(), nullable=True),
        # failures consumed so far (errors, timeouts, lost leases); Retry(delay) does not count
        sa.Column("retry_count", sa.Integer(), nullable=False, server_default="0"),
        # claims so far: the fencing token of every write after a claim
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.Text(), nullable=True),
        # the worker holding this waiting job in its hand (a full concurrency limit; migration
        # 0019): its hold is ``lease_expires_at``; NULL when no worker's hand has it
        sa.Column("held_by", sa.Text(), nullable=True),
        # since when that worker holds it (kept while the same worker holds it again): another
        # worker's claim takes a job held longer than a holder's retries (``job_claim_controlled``)
        sa.Column("held_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.Column("meta", pg.JSONB(), nullable=True),  # submit's ``meta`` (≤ 8 KiB); NULL: none
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        # {"percent", "message", "updated_at"}: the running attempt's report (job.set_progress)
        sa.Column("progress", pg.JSONB(), nullable=True),
        # the W3C traceparent of the submit (tracing, migration 0010): attempts join that trace
        sa.Column("trace_context", sa.Text(), nullable=True),
        sa.CheckConstraint("priority BETWEEN 0 AND 9", name="jobs_priority_range"),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="jobs_payload_object"),
    )

    # Every status change writes a new row version with an entry in each index (status is indexed,
    # so updates are not HOT): the indexes are few, and partial where they can be.
    # Operator queries and GET /jobs: backlog by type and status; keyset pages order by the
    # time-ordered UUIDv7 primary key.
    sa.Index("jobs_type_status_id_idx", jobs.c.job_type, jobs.c.status, jobs.c.id)
    sa.Index(
        "jobs_idempotency_key_idx",
        jobs.c.idempotency_key,
        unique=True,
        postgresql_where=jobs.c.idempotency_key.isnot(None),
    )
    # Maintenance: due scheduled/retrying jobs and expired leases, kept small by partial predicates.
    sa.Index(
        "jobs_due_idx",
        jobs.c.run_at,
        postgresql_where=jobs.c.status.in_(["SCHEDULED", "RETRYING"]),
    )
    sa.Index(
        "jobs_lease_idx",
        jobs.c.lease_expires_at,
        postgresql_where=jobs.c.status == "IN_PROGRESS",
    )
    # The lease sweep: jobs held in a worker's hand, by hold; one whose hold ran out (its holder
    # frozen or dead: the delivery was acknowledged) is published again (``job_republish_hand``).
    # No status in the predicate: the statements test the status with a CASE, so that no
    # other partial index (``jobs_waiting_idx``) can serve them (sql/attempts.sql's header). A
    # claim clears ``held_by``; a finished job that kept one has no lease and is never read.
    sa.Index(
        "jobs_hand_idx",
        jobs.c.lease_expires_at,
        postgresql_where=jobs.c.held_by.isnot(None),
    )
    # Retention, oldest first: COMPLETED/CANCELLED after retention_days, FAILED after
    # failed_retention_days, each from its own index, so an idle pass reads no row not yet due.
    sa.Index(
        "jobs_done_idx",
        jobs.c.finished_at,
        postgresql_where=jobs.c.status.in_(["COMPLETED", "CANCELLED"]),
    )
    sa.Index(
        "jobs_failed_idx",
        jobs.c.finished_at,
        postgresql_where=jobs.c.status == "FAILED",
    )
    # The reconciler: PENDING/RETRYING jobs by last touch; an idle pass reads an empty range.
    sa.Index(
        "jobs_waiting_idx",
        jobs.c.updated_at,
        jobs.c.job_type,
        postgresql_where=jobs.c.status.in_(["PENDING", "RETRYING"]),
    )

    sa.Table(
        "job_outbox",
        metadata,
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        # work: the type's queue; retry: the holding pen of delay_seconds; dead: dead letters
        sa.Column("destination", sa.Text(), nullable=False, server_default="work"),
        sa.Column("delay_seconds", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        # dead letters: the attempt that failed, so a redrive from the queue is fenced
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint(
            "destination IN ('work', 'retry', 'dead')", name="job_outbox_destination_check"
        ),
    )

    # The job types workers registered (with their handlers' defaults): the API accepts these.
    sa.Table(
        "job_types",
        metadata,
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("max_retries", sa.Integer(), nullable=True),
        sa.Column("timeout_seconds", sa.Float(), nullable=True),
        sa.Column("retry_delays", pg.ARRAY(sa.Integer()), nullable=True),
        sa.Column(
            "first_seen", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "last_seen", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        *_type_controls(),
    )
    _define_attempts(metadata)
    _define_keys(metadata)
    from .schema_features import define_features

    define_features(metadata)
    define_workflows(metadata, jobs)


def _define_keys(metadata: sa.MetaData) -> None:
    """API keys (migration 0006): only a SHA-256 of each key, looked up by its public id."""
    keys = sa.Table(
        "api_keys",
        metadata,
        sa.Column("key_id", sa.Text(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("key_hash", sa.LargeBinary(), nullable=False),
        sa.Column("scopes", pg.ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("octet_length(key_hash) = 32", name="api_keys_hash_length"),
    )
    sa.Index(
        "api_keys_active_name_idx",
        keys.c.name,
        unique=True,
        postgresql_where=keys.c.revoked_at.is_(None),
    )
    # the fleet-wide submit quota's buckets (migration 0012, api/ratelimit.py)
    sa.Table(
        "api_rate",
        metadata,
        sa.Column("key_id", sa.Text(), primary_key=True),
        sa.Column("tokens", pg.DOUBLE_PRECISION(), nullable=False),
        sa.Column("granted", pg.DOUBLE_PRECISION(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        prefixes=["UNLOGGED"],
    )


def _type_controls() -> list[sa.Column[Any] | sa.CheckConstraint]:
    """Pause and fleet-wide limits of a job type (``store/types.py``; the claim enforces them,
    ``store/attempts.py``). ``limits_set_at``: an operator changed the limits at run time, so
    registering workers keep them; ``recent_starts``: the sliding window of a rate limit."""
    return [
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("rate_limit", sa.Integer(), nullable=True),
        sa.Column("rate_period", sa.Integer(), nullable=True),
        sa.Column("limits_set_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "recent_starts",
            pg.ARRAY(sa.DateTime(timezone=True)),
            nullable=False,
            server_default="{}",
        ),
        # the claims of a concurrency limit, (id, attempt) pairs: exact under concurrent claims
        sa.Column("claim_ids", pg.ARRAY(pg.UUID()), nullable=False, server_default="{}"),
        sa.Column("claim_attempts", pg.ARRAY(sa.Integer()), nullable=False, server_default="{}"),
        sa.CheckConstraint("concurrency > 0", name="job_types_concurrency_positive"),
        sa.CheckConstraint(
            "(rate_limit IS NULL) = (rate_period IS NULL) AND rate_limit > 0 AND rate_period > 0",
            name="job_types_rate_positive",
        ),
    ]


ATTEMPT_OUTCOMES = ("completed", "retry", "failed", "cancelled", "released", "lease_expired")


def _define_attempts(metadata: sa.MetaData) -> None:
    """One row per finished attempt, inserted by the statement that finishes it (the running
    attempt is read from its ``jobs`` row). No foreign key: its per-row check would cost every
    finishing statement a trigger call; the retention statement deletes a job's attempts with
    the job instead."""
    outcomes = ", ".join(f"'{o}'" for o in ATTEMPT_OUTCOMES)
    attempts = sa.Table(
        "job_attempts",
        metadata,
        sa.Column("job_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_seconds", sa.Float(), nullable=True),
        # due (run_at, or created_at) → started: the queue wait of this attempt
        sa.Column("wait_seconds", sa.Float(), nullable=True),
        sa.CheckConstraint(f"outcome IN ({outcomes})", name="job_attempts_outcome_check"),
    )
    # Rows arrive in finishing order, so a BRIN index serves "the last hour" (views, dashboard)
    # for almost nothing on the hot path.
    sa.Index(
        "job_attempts_finished_brin",
        attempts.c.finished_at,
        postgresql_using="brin",
    )
