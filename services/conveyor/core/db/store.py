"""The only code that runs SQL. Every function takes a connection and never commits: the caller
owns the transaction. Statements are named ``<table>_<verb>`` and listed in ``STATEMENTS`` so a
test can prepare each one against a migrated database."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import orjson

from ..jobs import Status
from .schema import OUTBOX_CHANNEL


class Connection(Protocol):
    """The slice of ``asyncpg.Connection`` the store uses."""

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]: ...
    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any: ...
    async def fetchval(self, query: str, *args: Any, timeout: float | None = None) -> Any: ...
    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str: ...


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job ready to insert (see ``conveyor.enqueue.build_job``)."""

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


JOB_COLUMNS = """id, job_type, status::text AS status, priority, payload::text AS payload,
    result::text AS result, max_retries, timeout_seconds, retry_count, attempts, last_error,
    run_at, lease_expires_at, worker_id, cancel_requested, idempotency_key, request_hash,
    created_at, updated_at, started_at, finished_at"""

STATEMENTS: dict[str, str] = {}


def _stmt(name: str, sql: str) -> str:
    STATEMENTS[name] = sql
    return sql


JOB_INSERT_MANY = _stmt(
    "job_insert_many",
    f"""
WITH u AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int2[], $5::int4[],
                         $6::float8[], $7::timestamptz[], $8::float8[], $9::text[], $10::text[])
        AS u(id, job_type, payload, priority, max_retries, timeout_seconds, run_at, delay,
             ikey, rhash)
), v AS (
    SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay)) AS due FROM u
), ins AS (
    INSERT INTO jobs (id, job_type, status, priority, payload, max_retries, timeout_seconds,
                      run_at, idempotency_key, request_hash)
    SELECT id, job_type,
           (CASE WHEN due > now() THEN 'SCHEDULED' ELSE 'PENDING' END)::job_status,
           priority, payload::jsonb, max_retries, timeout_seconds, due, ikey, rhash
    FROM v
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), ob AS (
    INSERT INTO job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM ins WHERE status = 'PENDING'
)
SELECT {JOB_COLUMNS} FROM ins
""",
)

JOB_GET = _stmt("job_get", f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1")
JOB_GET_BY_IDEMPOTENCY_KEY = _stmt(
    "job_get_by_idempotency_key", f"SELECT {JOB_COLUMNS} FROM jobs WHERE idempotency_key = $1"
)

JOB_LIST = _stmt(
    "job_list",
    f"""
SELECT {JOB_COLUMNS} FROM jobs
WHERE ($1::text IS NULL OR job_type = $1)
  AND ($2::text IS NULL OR status = $2::job_status)
  AND ($3::uuid IS NULL OR id < $3)
ORDER BY id DESC
LIMIT $4
""",
)

# The claim: one conditional UPDATE for a batch of delivered ids. A job is claimable when it is
# PENDING, or RETRYING and due (a tolerance of one second absorbs broker/database clock skew).
# The attempt is counted here, so a handler that kills its process still uses up its retries.
JOB_CLAIM_MANY = _stmt(
    "job_claim_many",
    """
UPDATE jobs SET
    status = 'IN_PROGRESS',
    attempts = attempts + 1,
    started_at = now(),
    updated_at = now(),
    lease_expires_at = now() + make_interval(secs => $2),
    worker_id = $3,
    max_retries = COALESCE(max_retries, ($4::jsonb -> job_type ->> 'max_retries')::int, $5),
    timeout_seconds = COALESCE(timeout_seconds, ($4::jsonb -> job_type ->> 'timeout')::float8)
WHERE id = ANY($1::uuid[])
  AND job_type = ANY($6::text[])
  AND (status = 'PENDING' OR (status = 'RETRYING' AND run_at <= now() + interval '1 second'))
RETURNING id, job_type, payload::text AS payload, priority, attempts, retry_count, max_retries,
          timeout_seconds
""",
)

# Completion, fenced by (id, attempt): a worker whose lease was taken over changes nothing.
# A cancellation requested while the job ran wins and discards the result.
JOB_COMPLETE_MANY = _stmt(
    "job_complete_many",
    """
UPDATE jobs j SET
    status = (CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'COMPLETED' END)::job_status,
    result = CASE WHEN j.cancel_requested THEN NULL ELSE u.result::jsonb END,
    finished_at = now(), updated_at = now(), lease_expires_at = NULL
FROM unnest($1::uuid[], $2::int4[], $3::text[]) AS u(id, attempt, result)
WHERE j.id = u.id AND j.attempts = u.attempt AND j.status = 'IN_PROGRESS'
RETURNING j.id
""",
)

# Failure of an attempt, fenced like completion. ``delay`` NULL means retries are exhausted
# (FAILED + a dead-letter copy); otherwise RETRYING + a message to the holding pen of that delay
# (0: straight back to the work queue). ``consume`` says whether it used up a retry.
JOB_FAIL_MANY = _stmt(
    "job_fail_many",
    """
WITH u AS (
    SELECT * FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::int4[], $5::bool[])
        AS u(id, attempt, error, delay, consume)
), upd AS (
    UPDATE jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED'
                       WHEN u.delay IS NULL THEN 'FAILED'
                       ELSE 'RETRYING' END)::job_status,
        last_error = u.error,
        retry_count = j.retry_count + (CASE WHEN u.consume THEN 1 ELSE 0 END),
        run_at = CASE WHEN u.delay IS NULL THEN j.run_at
                      ELSE now() + make_interval(secs => u.delay) END,
        finished_at = CASE WHEN u.delay IS NULL OR j.cancel_requested THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM u
    WHERE j.id = u.id AND j.attempts = u.attempt AND j.status = 'IN_PROGRESS'
    RETURNING j.id, j.job_type, j.priority, j.status, u.delay, u.error
), ob AS (
    INSERT INTO job_outbox (job_id, job_type, priority, destination, delay_seconds, error)
    SELECT id, job_type, priority,
           CASE WHEN status = 'FAILED' THEN 'dead' WHEN delay > 0 THEN 'retry' ELSE 'work' END,
           CASE WHEN status = 'RETRYING' AND delay > 0 THEN delay END,
           CASE WHEN status = 'FAILED' THEN left(error, 2000) END
    FROM upd WHERE status IN ('RETRYING', 'FAILED')
)
SELECT id, status::text AS status FROM upd
""",
)

# Hand a job back without consuming a retry (graceful shutdown that could not finish it).
JOB_RELEASE_MANY = _stmt(
    "job_release_many",
    """
WITH upd AS (
    UPDATE jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END)::job_status,
        finished_at = CASE WHEN j.cancel_requested THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
    WHERE j.id = u.id AND j.attempts = u.attempt AND j.status = 'IN_PROGRESS'
    RETURNING j.id, j.job_type, j.priority, j.status
), ob AS (
    INSERT INTO job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM upd WHERE status = 'PENDING'
)
SELECT id FROM upd
""",
)

JOB_HEARTBEAT_MANY = _stmt(
    "job_heartbeat_many",
    """
UPDATE jobs j SET lease_expires_at = now() + make_interval(secs => $3)
FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
WHERE j.id = u.id AND j.attempts = u.attempt AND j.status = 'IN_PROGRESS'
RETURNING j.id, j.cancel_requested
""",
)

# Deliveries a worker holds while it waits for a free slot: their jobs are in hand, not lost, so
# they must not look overdue to the reconciler (which only sees the queue's *ready* messages).
JOB_TOUCH_WAITING = _stmt(
    "job_touch_waiting",
    """
UPDATE jobs SET updated_at = now()
WHERE id = ANY($1::uuid[]) AND status IN ('PENDING', 'RETRYING')
""",
)

JOB_CANCEL = _stmt(
    "job_cancel",
    """
UPDATE jobs SET
    status = (CASE WHEN status = 'IN_PROGRESS' THEN 'IN_PROGRESS' ELSE 'CANCELLED' END)::job_status,
    cancel_requested = true,
    finished_at = CASE WHEN status = 'IN_PROGRESS' THEN NULL ELSE now() END,
    updated_at = now()
WHERE id = $1 AND status IN ('PENDING', 'SCHEDULED', 'RETRYING', 'IN_PROGRESS')
RETURNING id
""",
)

# Redrive: FAILED or CANCELLED → PENDING with fresh retries. ``attempts`` is never reset: it is
# the fencing token and must only grow.
JOB_REDRIVE = _stmt(
    "job_redrive",
    """
WITH r AS (
    UPDATE jobs SET status = 'PENDING', retry_count = 0, cancel_requested = false,
        result = NULL, finished_at = NULL, run_at = NULL, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND status IN ('FAILED', 'CANCELLED')
    RETURNING id, job_type, priority
), ob AS (
    INSERT INTO job_outbox (job_id, job_type, priority) SELECT id, job_type, priority FROM r
)
SELECT id FROM r
""",
)

# A dead letter's redrive, fenced by the attempt it recorded: only a job still FAILED at that
# attempt is revived, never one redriven since (and then cancelled, or failed again later).
JOB_REDRIVE_FENCED = _stmt(
    "job_redrive_fenced",
    """
WITH r AS (
    UPDATE jobs j SET status = 'PENDING', retry_count = 0, cancel_requested = false,
        result = NULL, finished_at = NULL, run_at = NULL, updated_at = now()
    FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
    WHERE j.id = u.id AND j.attempts = u.attempt AND j.status = 'FAILED'
    RETURNING j.id, j.job_type, j.priority
), ob AS (
    INSERT INTO job_outbox (job_id, job_type, priority) SELECT id, job_type, priority FROM r
)
SELECT id FROM r
""",
)

JOB_FENCE_MANY = _stmt(
    "job_fence_many",
    "SELECT id, status::text AS status, attempts FROM jobs WHERE id = ANY($1::uuid[])",
)

JOB_STATUS_MANY = _stmt(
    "job_status_many",
    "SELECT id, status::text AS status FROM jobs WHERE id = ANY($1::uuid[])",
)

# ------------------------------------------------------------------------------- maintenance

JOB_PROMOTE_DUE = _stmt(
    "job_promote_due",
    """
WITH due AS (
    SELECT id FROM jobs WHERE status = 'SCHEDULED' AND run_at <= now()
    ORDER BY run_at LIMIT $1 FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs j SET status = 'PENDING', updated_at = now() FROM due WHERE j.id = due.id
    RETURNING j.id, j.job_type, j.priority
), ob AS (
    INSERT INTO job_outbox (job_id, job_type, priority) SELECT id, job_type, priority FROM upd
)
SELECT count(*) FROM upd
""",
)

# Expired leases: the worker died or hung. With retries left the job goes back to the queue
# (consuming a retry); otherwise it fails and is dead-lettered. A pending cancellation wins.
JOB_RECOVER_EXPIRED = _stmt(
    "job_recover_expired",
    """
WITH exp AS (
    SELECT id FROM jobs WHERE status = 'IN_PROGRESS' AND lease_expires_at < now()
    ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED'
                       WHEN j.retry_count < COALESCE(j.max_retries, $2) THEN 'RETRYING'
                       ELSE 'FAILED' END)::job_status,
        retry_count = j.retry_count + (CASE WHEN j.cancel_requested THEN 0 ELSE 1 END),
        last_error = 'lease expired: worker ' || COALESCE(j.worker_id, '?')
                     || ' stopped heartbeating during attempt ' || j.attempts,
        run_at = now(),
        finished_at = CASE WHEN j.cancel_requested OR j.retry_count >= COALESCE(j.max_retries, $2)
                           THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM exp WHERE j.id = exp.id
    RETURNING j.id, j.job_type, j.priority, j.status, j.last_error
), ob AS (
    INSERT INTO job_outbox (job_id, job_type, priority, destination, error)
    SELECT id, job_type, priority, CASE WHEN status = 'FAILED' THEN 'dead' ELSE 'work' END,
           CASE WHEN status = 'FAILED' THEN last_error END
    FROM upd WHERE status IN ('RETRYING', 'FAILED')
)
SELECT id, status::text AS status FROM upd
""",
)

# Jobs that should have reached a worker long ago and have no outbox row in flight: counted per
# type, so the reconciler can compare with the broker's queue depth before re-publishing.
JOB_COUNT_OVERDUE = _stmt(
    "job_count_overdue",
    """
SELECT job_type, count(*) AS n FROM jobs j
WHERE j.status IN ('PENDING', 'RETRYING')
  AND j.updated_at < now() - make_interval(secs => $1)
  AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $1))
  AND NOT EXISTS (SELECT 1 FROM job_outbox o WHERE o.job_id = j.id)
GROUP BY job_type
""",
)

JOB_REPUBLISH_OVERDUE = _stmt(
    "job_republish_overdue",
    """
WITH o AS (
    SELECT id FROM jobs j
    WHERE j.job_type = $1 AND j.status IN ('PENDING', 'RETRYING')
      AND j.updated_at < now() - make_interval(secs => $2)
      AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $2))
      AND NOT EXISTS (SELECT 1 FROM job_outbox x WHERE x.job_id = j.id)
    ORDER BY j.updated_at LIMIT $3 FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs j SET updated_at = now() FROM o WHERE j.id = o.id
    RETURNING j.id, j.job_type, j.priority
), ob AS (
    INSERT INTO job_outbox (job_id, job_type, priority) SELECT id, job_type, priority FROM upd
)
SELECT count(*) FROM upd
""",
)

JOB_DELETE_EXPIRED = _stmt(
    "job_delete_expired",
    """
WITH d AS (
    SELECT id FROM jobs WHERE status IN ('COMPLETED', 'CANCELLED')
      AND finished_at < now() - make_interval(secs => $1)
    LIMIT $2 FOR UPDATE SKIP LOCKED
)
DELETE FROM jobs j USING d WHERE j.id = d.id
""",
)

# ------------------------------------------------------------------------------- outbox

# The relay takes a batch in one statement: the rows are deleted inside the relay's open
# transaction, which commits only after every publish is confirmed. A crash before the commit
# rolls the delete back (the rows are published again: duplicates, never losses); rows whose
# publish failed are put back with ``outbox_restore`` before the commit. Rows of job types ($2)
# and retry pens ($3) whose declaration the broker refuses stay where they are meanwhile. A dead
# letter carries the attempt that failed (a FAILED job's ``attempts`` only changes after a
# redrive), so redriving it is fenced by that attempt.
OUTBOX_TAKE_BATCH = _stmt(
    "outbox_take_batch",
    """
DELETE FROM job_outbox
WHERE id IN (
    SELECT id FROM job_outbox
    WHERE job_type <> ALL($2::text[])
      AND (destination <> 'retry' OR delay_seconds <> ALL($3::int4[]))
    ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
RETURNING id, job_id, job_type, priority, destination, delay_seconds, error,
    CASE WHEN destination = 'dead'
         THEN (SELECT attempts FROM jobs j WHERE j.id = job_outbox.job_id) END AS attempt
""",
)

OUTBOX_NOTIFY = _stmt("outbox_notify", f"SELECT pg_notify('{OUTBOX_CHANNEL}', '')")

OUTBOX_RESTORE = _stmt(
    "outbox_restore",
    """
INSERT INTO job_outbox (id, job_id, job_type, priority, destination, delay_seconds, error)
SELECT * FROM unnest($1::int8[], $2::uuid[], $3::text[], $4::int2[], $5::text[], $6::int4[],
                     $7::text[])
""",
)


# ------------------------------------------------------------------------------- functions


def _arr(values: Iterable[Any]) -> list[Any]:
    return list(values)


async def job_insert_many(conn: Connection, jobs: Sequence[NewJob]) -> dict[uuid.UUID, Any]:
    """Insert jobs and their outbox rows in one statement (atomic without an explicit
    transaction). Returns the inserted rows by id; a job whose idempotency key already exists is
    not inserted and is missing from the result."""
    rows = await conn.fetch(
        JOB_INSERT_MANY,
        _arr(j.id for j in jobs),
        _arr(j.job_type for j in jobs),
        _arr(j.payload_json for j in jobs),
        _arr(j.priority for j in jobs),
        _arr(j.max_retries for j in jobs),
        _arr(j.timeout_seconds for j in jobs),
        _arr(j.run_at for j in jobs),
        _arr(j.delay_seconds for j in jobs),
        _arr(j.idempotency_key for j in jobs),
        _arr(j.request_hash for j in jobs),
    )
    return {r["id"]: _decode(r) for r in rows}


async def job_get(conn: Connection, job_id: uuid.UUID) -> Mapping[str, Any] | None:
    row = await conn.fetchrow(JOB_GET, job_id)
    return _decode(row) if row is not None else None


async def job_get_by_idempotency_key(conn: Connection, key: str) -> Mapping[str, Any] | None:
    row = await conn.fetchrow(JOB_GET_BY_IDEMPOTENCY_KEY, key)
    return _decode(row) if row is not None else None


async def job_list(
    conn: Connection,
    *,
    job_type: str | None,
    status: str | None,
    after: uuid.UUID | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Newest first: ids are UUIDv7, so ``id`` order is creation order (keyset on ``id``)."""
    rows = await conn.fetch(JOB_LIST, job_type, status, after, limit)
    return [_decode(r) for r in rows]


def _decode(row: Any) -> dict[str, Any]:
    d = dict(row)
    d["payload"] = orjson.loads(d["payload"])
    if d.get("result") is not None:
        d["result"] = orjson.loads(d["result"])
    return d


async def job_cancel(conn: Connection, job_id: uuid.UUID) -> bool:
    return await conn.fetchval(JOB_CANCEL, job_id) is not None


async def job_redrive(conn: Connection, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    return [r["id"] for r in await conn.fetch(JOB_REDRIVE, list(ids))]


async def job_status_many(conn: Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Status]:
    return {r["id"]: Status(r["status"]) for r in await conn.fetch(JOB_STATUS_MANY, list(ids))}


async def job_redrive_fenced(
    conn: Connection, items: Sequence[tuple[uuid.UUID, int]]
) -> list[uuid.UUID]:
    rows = await conn.fetch(JOB_REDRIVE_FENCED, [i for i, _ in items], [a for _, a in items])
    return [r["id"] for r in rows]


async def job_fence_many(
    conn: Connection, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[Status, int]]:
    """id → (status, attempts)."""
    rows = await conn.fetch(JOB_FENCE_MANY, list(ids))
    return {r["id"]: (Status(r["status"]), r["attempts"]) for r in rows}


async def outbox_notify(conn: Connection) -> None:
    """Wake the publishers when the surrounding transaction commits (see ``db/notify.py``)."""
    await conn.execute(OUTBOX_NOTIFY)
