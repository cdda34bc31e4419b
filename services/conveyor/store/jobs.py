"""Jobs as submitters and operators see them: insert, read, list, cancel, redrive."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from ..core.jobs import Status
from .base import Connection, Statements
from .registry import statement
from .rows import Attempt, JobRow, NewJob

# What a submit returns (a new job has no progress yet and the plain insert writes no meta: the
# insert, on the submit hot path, reads neither; it also runs on schemas from before them, which
# the round-one upgrade test enqueues into) and what every read returns.
INSERTED_COLUMNS = """id, job_type, status::text AS status, priority, payload::text AS payload,
    result::text AS result, max_retries, timeout_seconds, retry_count, attempts, last_error,
    run_at, lease_expires_at, worker_id, cancel_requested, idempotency_key, request_hash,
    created_at, updated_at, started_at, finished_at"""
JOB_INSERT_COLUMNS = INSERTED_COLUMNS
JOB_COLUMNS = INSERTED_COLUMNS + ", progress::text AS progress, meta::text AS meta"

_JOB_INSERT = f"""
WITH u AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int2[], $5::int4[],
                         $6::float8[], $7::timestamptz[], $8::float8[], $9::text[], $10::text[])
        AS u(id, job_type, payload, priority, max_retries, timeout_seconds, run_at, delay,
             ikey, rhash)
), v AS (
    SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay)) AS due FROM u
), ins AS (
    INSERT INTO __schema__.jobs (id, job_type, status, priority, payload, max_retries,
                                 timeout_seconds, run_at, idempotency_key, request_hash)
    SELECT id, job_type,
           (CASE WHEN due > now() THEN 'SCHEDULED' ELSE 'PENDING' END)::__schema__.job_status,
           priority, payload::jsonb, max_retries, timeout_seconds, due, ikey, rhash
    FROM v
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM ins WHERE status = 'PENDING'
)
SELECT {INSERTED_COLUMNS} FROM ins
"""
JOB_INSERT_MANY = statement("job_insert_many", _JOB_INSERT)


def _with_trace_context(sql: str) -> str:
    """The insert that also stores the submit's ``traceparent`` (``$11``, one for the whole
    request): used only when there is one (tracing on, or an incoming header), so the usual
    insert stays as it was. Fails at import if the insert changed shape."""
    edits = [("idempotency_key, request_hash)", "idempotency_key, request_hash, trace_context)"),
             ("ikey, rhash\n    FROM v", "ikey, rhash, $11::text\n    FROM v")]  # fmt: skip
    for old, new in edits:
        assert sql.count(old) == 1, f"job_insert_many changed: {old!r} not found once"
        sql = sql.replace(old, new)
    return sql


JOB_INSERT_MANY_TRACED = statement("job_insert_many_traced", _with_trace_context(_JOB_INSERT))

JOB_GET = statement("job_get", f"SELECT {JOB_COLUMNS} FROM __schema__.jobs WHERE id = $1")

JOB_GET_BY_IDEMPOTENCY_KEY = statement(
    "job_get_by_idempotency_key",
    f"SELECT {JOB_COLUMNS} FROM __schema__.jobs WHERE idempotency_key = $1",
)

# GET /jobs is ``job_list`` in ``dashboard.py``: the same index-served pages as the dashboard.

# A waiting job may be *held* (a lease on a PENDING/RETRYING job: ``store/maintenance.py``'s
# ``UNHELD``): cancelling it drops the hold, so a CANCELLED job has no lease and a redrive (which
# clears one all the same) does not leave the reconciler blind to the redriven job's lost message
# for the rest of a pen's delay (up to hours for a rate window). The hold of a rate window also
# moved ``run_at`` to the window's end: only a SCHEDULED job keeps its ``run_at`` (a redrive
# brings a cancelled job that never ran back SCHEDULED only while that is ahead).
JOB_CANCEL = statement(
    "job_cancel",
    """
UPDATE __schema__.jobs SET
    status = (CASE WHEN status = 'IN_PROGRESS' THEN 'IN_PROGRESS' ELSE 'CANCELLED' END)
             ::__schema__.job_status,
    cancel_requested = true,
    finished_at = CASE WHEN status = 'IN_PROGRESS' THEN NULL ELSE now() END,
    lease_expires_at = CASE WHEN status = 'IN_PROGRESS' THEN lease_expires_at END,
    run_at = CASE WHEN status IN ('SCHEDULED', 'IN_PROGRESS') THEN run_at END,
    updated_at = now()
WHERE id = $1 AND status IN ('PENDING', 'SCHEDULED', 'RETRYING', 'IN_PROGRESS')
RETURNING id
""",
)

# Redrive: FAILED or CANCELLED → PENDING with fresh retries; a cancelled job whose ``run_at`` is
# still ahead (a cancelled scheduled job) goes back to SCHEDULED with it, and the promoter
# publishes it when due. ``attempts`` is never reset: it is the fencing token and only grows.
_REDRIVE_SET = """
    status = (CASE WHEN status = 'CANCELLED' AND attempts = 0 AND run_at > now()
                   THEN 'SCHEDULED' ELSE 'PENDING' END)::__schema__.job_status,
    run_at = CASE WHEN status = 'CANCELLED' AND attempts = 0 AND run_at > now()
                  THEN run_at END,
    retry_count = 0, cancel_requested = false, result = NULL, finished_at = NULL,
    lease_expires_at = NULL, updated_at = now()
"""

JOB_REDRIVE = statement(
    "job_redrive",
    f"""
WITH r AS (
    UPDATE __schema__.jobs SET {_REDRIVE_SET}
    WHERE id = ANY($1::uuid[]) AND status IN ('FAILED', 'CANCELLED')
    RETURNING id, job_type, priority, status
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
)
SELECT id FROM r
""",
)

# The dead-letter tools' redrive: only a job still in the failure its dead letter recorded
# (FAILED at that attempt). A job redriven since — then cancelled, completed or failed again
# (a newer dead letter exists) — is left alone, and the caller drops the stale letter.
JOB_REDRIVE_FAILED = statement(
    "job_redrive_failed",
    f"""
WITH r AS (
    UPDATE __schema__.jobs j SET {_REDRIVE_SET}
    FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
    WHERE j.id = u.id AND j.attempts = u.attempt AND j.status = 'FAILED'
    RETURNING j.id, j.job_type, j.priority, j.status
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
)
SELECT id FROM r
""",
)

# The dead-letter tools compare a letter's attempt with the job's (stale unless FAILED at it);
# the worker explains a dropped delivery by its job's status.
JOB_FENCE_MANY = statement(
    "job_fence_many",
    "SELECT id, status::text AS status, attempts FROM __schema__.jobs WHERE id = ANY($1::uuid[])",
)


def insert_arrays(jobs: Sequence[NewJob]) -> list[list[object]]:
    """The column arrays ``$1``-``$10`` of both job inserts (``job_insert_many`` and
    ``unique.job_insert_full``), in their order."""
    return [
        [j.id for j in jobs],
        [j.job_type for j in jobs],
        [j.payload_json for j in jobs],
        [j.priority for j in jobs],
        [j.max_retries for j in jobs],
        [j.timeout_seconds for j in jobs],
        [j.run_at for j in jobs],
        [j.delay_seconds for j in jobs],
        [j.idempotency_key for j in jobs],
        [j.request_hash for j in jobs],
    ]


class JobStatements(Statements):
    async def job_insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], trace_context: str | None = None
    ) -> dict[uuid.UUID, JobRow]:
        """Insert jobs and their outbox rows in one statement (atomic without an explicit
        transaction). Returns the inserted rows by id; a job whose idempotency key already
        exists is not inserted and is missing from the result. ``trace_context``: the
        submit's ``traceparent`` (``core/tracing.py``), stored with every job."""
        traced = () if trace_context is None else (trace_context,)
        rows = await conn.fetch(
            self.sql[JOB_INSERT_MANY_TRACED if traced else JOB_INSERT_MANY],
            *insert_arrays(jobs),
            *traced,
        )
        return {r["id"]: JobRow.from_record(r) for r in rows}

    async def job_get(self, conn: Connection, job_id: uuid.UUID) -> JobRow | None:
        row = await conn.fetchrow(self.sql[JOB_GET], job_id)
        return JobRow.from_record(row) if row is not None else None

    async def job_get_by_idempotency_key(self, conn: Connection, key: str) -> JobRow | None:
        row = await conn.fetchrow(self.sql[JOB_GET_BY_IDEMPOTENCY_KEY], key)
        return JobRow.from_record(row) if row is not None else None

    async def job_cancel(self, conn: Connection, job_id: uuid.UUID) -> bool:
        """Cancel a waiting job, or ask a running one to stop. False when not cancellable."""
        return await conn.fetchval(self.sql[JOB_CANCEL], job_id) is not None

    async def job_redrive(self, conn: Connection, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """FAILED or CANCELLED jobs back to PENDING; a cancelled job that never ran and whose
        ``run_at`` is still ahead keeps its schedule (SCHEDULED). A cancelled retry's ``run_at``
        is a backoff, not a schedule: it runs now. Returns the ids redriven."""
        return [r["id"] for r in await conn.fetch(self.sql[JOB_REDRIVE], list(ids))]

    async def job_redrive_failed(
        self, conn: Connection, letters: Sequence[Attempt]
    ) -> list[uuid.UUID]:
        """Redrive each job only while it is still FAILED at the attempt its dead letter
        recorded. Returns the ids redriven; the other letters are stale."""
        rows = await conn.fetch(
            self.sql[JOB_REDRIVE_FAILED],
            [a.job_id for a in letters],
            [a.attempt for a in letters],
        )
        return [r["id"] for r in rows]

    async def job_fence_many(
        self, conn: Connection, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[Status, int]]:
        """id → (status, attempts); a missing id: no such job."""
        rows = await conn.fetch(self.sql[JOB_FENCE_MANY], list(ids))
        return {r["id"]: (Status(r["status"]), r["attempts"]) for r in rows}
