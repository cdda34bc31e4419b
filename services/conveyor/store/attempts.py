"""Jobs as workers see them: claim a batch of deliveries, heartbeat, write outcomes. Every write
after the claim is fenced by (job id, attempt): a worker whose lease was taken over changes
nothing."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..core.jobs import Status
from .base import Connection, Statements
from .history import FINISHED, finished, record
from .registry import statement
from .rows import Attempt, ClaimedJob, Completion, Failure


# A job's status tested so that no partial index's predicate follows from it (the planner cannot
# see through a CASE). Written as ``status IN ('PENDING', 'RETRYING')``, the test implies
# ``jobs_waiting_idx``'s predicate, and with statistics taken before a backlog arrived the planner
# ANDed a scan of that whole index with the ids: every claim of a few ids read every waiting
# job's entry (``tests/integration/test_claim_plan.py``, stale statistics).
def claimable(alias: str = "", now: str = "now()") -> str:
    """PENDING, or RETRYING and due (one second absorbs broker/database clock skew)."""
    a = f"{alias}." if alias else ""
    return (f"CASE {a}status WHEN 'PENDING' THEN true WHEN 'RETRYING' THEN "
            f"{a}run_at <= {now} + interval '1 second' ELSE false END")  # fmt: skip


def status_in(*statuses: str, alias: str = "") -> str:
    """``status IN (statuses)`` written so that no partial index's predicate follows from it."""
    a = f"{alias}." if alias else ""
    whens = " ".join(f"WHEN '{s}' THEN true" for s in statuses)
    return f"CASE {a}status {whens} ELSE false END"


WAITING = status_in("PENDING", "RETRYING")
# The writes after a claim find their rows by id; ``j.status = 'IN_PROGRESS'`` would imply
# ``jobs_lease_idx``'s predicate, and a plan cached for a fresh install's empty tables joined the
# ids with a scan of that whole index, dead entries of every job ever claimed included
# (``test_finishing_statements_keep_reading_their_ids_on_one_connection``).
RUNNING = status_in("IN_PROGRESS", alias="j")

# The claim: one conditional UPDATE for a batch of delivered ids. A job is claimable when it is
# PENDING, or RETRYING and due (a tolerance of one second absorbs broker/database clock skew).
# The attempt is counted here, so a handler that kills its process still uses up its retries.
# The ids lead (``jobs_pkey``); the type test is written so no index can serve it: as
# ``job_type = ANY($6)`` the planner, for a type ANALYZE has not seen yet (new, or grown
# since), took the type's whole range of ``jobs_type_status_id_idx`` for one row and filtered
# the ids out of it (691,500 finished jobs read for 500 ids at 10 million rows; issue 14,
# ``tests/integration/test_claim_plan.py``).
JOB_CLAIM_MANY = statement(
    "job_claim_many",
    f"""
UPDATE __schema__.jobs SET
    status = 'IN_PROGRESS',
    attempts = attempts + 1,
    started_at = now(),
    updated_at = now(),
    lease_expires_at = now() + make_interval(secs => $2),
    worker_id = $3,
    max_retries = COALESCE(max_retries, ($4::jsonb -> job_type ->> 'max_retries')::int, $5),
    timeout_seconds = COALESCE(timeout_seconds, ($4::jsonb -> job_type ->> 'timeout')::float8)
WHERE id = ANY($1::uuid[])
  AND array_position($6::text[], job_type) IS NOT NULL
  AND {claimable()}
RETURNING id, job_type, payload::text AS payload, priority, attempts, retry_count, max_retries,
          timeout_seconds, meta::text AS meta,
          greatest(0, extract(epoch FROM now() - COALESCE(run_at, created_at)))::float8 AS wait,
          trace_context
""",
)

# The attempt row each finishing statement inserts (``history.record``), by the job's new status.
_RECORD_COMPLETED = record("CASE WHEN status = 'CANCELLED' THEN 'cancelled' ELSE 'completed' END")
_RECORD_FAILED = record(
    "CASE status WHEN 'CANCELLED' THEN 'cancelled' WHEN 'FAILED' THEN 'failed' ELSE 'retry' END"
)
_RECORD_RELEASED = record("CASE WHEN status = 'CANCELLED' THEN 'cancelled' ELSE 'released' END")

# A cancellation requested while the job ran wins and discards the result.
JOB_COMPLETE_MANY = statement(
    "job_complete_many",
    f"""
WITH upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'COMPLETED' END)
                 ::__schema__.job_status,
        result = CASE WHEN j.cancel_requested THEN NULL ELSE u.result::jsonb END,
        finished_at = now(), updated_at = now(), lease_expires_at = NULL
    FROM unnest($1::uuid[], $2::int4[], $3::text[]) AS u(id, attempt, result)
    WHERE j.id = u.id AND j.attempts = u.attempt AND {RUNNING}
    RETURNING {FINISHED}, NULL::text AS error
), att AS (
    {_RECORD_COMPLETED}
)
SELECT id FROM upd
""",
)

# ``delay`` NULL means retries are exhausted (FAILED + a dead-letter copy); otherwise RETRYING +
# a message to the holding pen of that delay (0: straight back to the work queue). ``consume``
# says whether it uses up a retry. ``retry_count`` counts retries performed, so it never exceeds
# ``max_retries``: a consuming failure with no retry left is FAILED whatever the writer asked
# (``_EXHAUSTED``), and a FAILED or CANCELLED job does not count another retry.
_EXHAUSTED = "(u.delay IS NULL OR (u.consume AND j.retry_count >= j.max_retries))"
JOB_FAIL_MANY = statement(
    "job_fail_many",
    f"""
WITH u AS (  -- each failure with its attempt's due time, read before a retry rewrites run_at
    SELECT u.*, COALESCE(o.run_at, o.created_at) AS due
    FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::int4[], $5::bool[])
        AS u(id, attempt, error, delay, consume)
    JOIN __schema__.jobs o ON o.id = u.id
), upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED'
                       WHEN {_EXHAUSTED} THEN 'FAILED'
                       ELSE 'RETRYING' END)::__schema__.job_status,
        last_error = u.error,
        retry_count = j.retry_count + (CASE WHEN u.consume AND NOT {_EXHAUSTED}
                                            AND NOT j.cancel_requested THEN 1 ELSE 0 END),
        run_at = CASE WHEN {_EXHAUSTED} THEN j.run_at
                      ELSE now() + make_interval(secs => u.delay) END,
        finished_at = CASE WHEN {_EXHAUSTED} OR j.cancel_requested THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM u
    WHERE j.id = u.id AND j.attempts = u.attempt AND {RUNNING}
    RETURNING {finished("u.due")}, j.priority, u.delay, u.error
), att AS (
    {_RECORD_FAILED}
), ob AS (  -- a dead letter's error is cut to the wire's limit by the relay (broker/wire.py)
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds,
                                       error, attempt)
    SELECT id, job_type, priority,
           CASE WHEN status = 'FAILED' THEN 'dead' WHEN delay > 0 THEN 'retry' ELSE 'work' END,
           CASE WHEN status = 'RETRYING' AND delay > 0 THEN delay END,
           CASE WHEN status = 'FAILED' THEN error END,
           CASE WHEN status = 'FAILED' THEN attempts END
    FROM upd WHERE status IN ('RETRYING', 'FAILED')
)
SELECT id, status::text AS status FROM upd
""",
)

# Hand a job back without consuming a retry (graceful shutdown that could not finish it).
JOB_RELEASE_MANY = statement(
    "job_release_many",
    f"""
WITH upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END)
                 ::__schema__.job_status,
        finished_at = CASE WHEN j.cancel_requested THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
    WHERE j.id = u.id AND j.attempts = u.attempt AND {RUNNING}
    RETURNING {FINISHED}, j.priority, NULL::text AS error
), att AS (
    {_RECORD_RELEASED}
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM upd WHERE status = 'PENDING'
)
SELECT id FROM upd
""",
)

JOB_HEARTBEAT_MANY = statement(
    "job_heartbeat_many",
    f"""
UPDATE __schema__.jobs j SET lease_expires_at = now() + make_interval(secs => $3)
FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
WHERE j.id = u.id AND j.attempts = u.attempt AND {RUNNING}
RETURNING j.id, j.cancel_requested
""",
)

# Deliveries a worker holds while it waits for a free slot: their jobs are in hand, not lost,
# and their messages are not among the queue's *ready* ones, which is all the reconciler sees.
# The touch marks them *held* until ``$2`` seconds from now (``lease_expires_at`` of a waiting
# job; ``store/maintenance.py``'s ``UNHELD``): the reconciler counts a held job neither as overdue
# nor as fresh (a fresh job stands for a ready message). A holder that dies stops touching; the
# broker requeues its unacknowledged deliveries and the hold runs out.
JOB_TOUCH_WAITING = statement(
    "job_touch_waiting",
    f"""
UPDATE __schema__.jobs SET updated_at = now(), lease_expires_at = now() + make_interval(secs => $2)
WHERE id = ANY($1::uuid[]) AND {WAITING}
""",
)


@dataclass(frozen=True, slots=True)
class HandlerDefaults:
    """Handlers' defaults (type → ``{"max_retries", "timeout"}``) as the claim's JSON argument,
    encoded once per worker instead of once per claim."""

    json: str

    @classmethod
    def of(cls, defaults: Mapping[str, Mapping[str, Any]]) -> HandlerDefaults:
        return cls(orjson.dumps(defaults).decode())


class AttemptStatements(Statements):
    async def job_claim_many(
        self,
        conn: Connection,
        ids: Sequence[uuid.UUID],
        *,
        lease_seconds: float,
        worker_id: str,
        types: Sequence[str],
        handler_defaults: HandlerDefaults | Mapping[str, Mapping[str, Any]],
        default_max_retries: int,
    ) -> list[ClaimedJob]:
        """Claim the runnable jobs among ``ids`` (of the ``types`` this worker runs); the others
        (duplicates, finished or cancelled jobs) are missing from the result. What the submitter
        left out comes from ``handler_defaults`` (type → ``{"max_retries", "timeout"}``; a
        worker passes them encoded once, as ``HandlerDefaults``)."""
        if not isinstance(handler_defaults, HandlerDefaults):
            handler_defaults = HandlerDefaults.of(handler_defaults)
        rows = await conn.fetch(
            self.sql[JOB_CLAIM_MANY],
            list(ids),
            lease_seconds,
            worker_id,
            handler_defaults.json,
            default_max_retries,
            list(types),
        )
        return [ClaimedJob.from_record(r) for r in rows]

    async def job_complete_many(
        self, conn: Connection, items: Sequence[Completion]
    ) -> set[uuid.UUID]:
        """Returns the ids written (a fenced or finished attempt is not)."""
        rows = await conn.fetch(
            self.sql[JOB_COMPLETE_MANY],
            [c.job_id for c in items],
            [c.attempt for c in items],
            [c.result_json for c in items],
        )
        return {r["id"] for r in rows}

    async def job_fail_many(
        self, conn: Connection, items: Sequence[Failure]
    ) -> dict[uuid.UUID, Status]:
        """Returns the new status of each job written (a fenced attempt is missing)."""
        rows = await conn.fetch(
            self.sql[JOB_FAIL_MANY],
            [f.job_id for f in items],
            [f.attempt for f in items],
            [f.error for f in items],
            [f.delay for f in items],
            [f.consume for f in items],
        )
        return {r["id"]: Status(r["status"]) for r in rows}

    async def job_release_many(self, conn: Connection, items: Sequence[Attempt]) -> set[uuid.UUID]:
        rows = await conn.fetch(
            self.sql[JOB_RELEASE_MANY], [a.job_id for a in items], [a.attempt for a in items]
        )
        return {r["id"] for r in rows}

    async def job_heartbeat_many(
        self, conn: Connection, items: Sequence[Attempt], *, lease_seconds: float
    ) -> dict[uuid.UUID, bool]:
        """Extend the leases still held. Returns, per job whose lease was extended, whether a
        cancellation was requested; a job missing from the result lost its lease."""
        rows = await conn.fetch(
            self.sql[JOB_HEARTBEAT_MANY],
            [a.job_id for a in items],
            [a.attempt for a in items],
            lease_seconds,
        )
        return {r["id"]: r["cancel_requested"] for r in rows}

    async def job_touch_waiting(
        self, conn: Connection, ids: Sequence[uuid.UUID], *, hold_seconds: float
    ) -> None:
        """Mark waiting jobs held by this worker for ``hold_seconds`` (refreshed before then)."""
        await conn.execute(self.sql[JOB_TOUCH_WAITING], list(ids), hold_seconds)
