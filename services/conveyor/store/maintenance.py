"""The sweeper's statements: promote due jobs, recover expired leases, reconcile lost messages,
delete old finished jobs. Each takes a batch size and locks with ``SKIP LOCKED``, so several
sweepers can run at once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from ..core.jobs import PEN_LADDER, Status
from .base import Connection, Statements, affected
from .history import finished, record
from .registry import statement
from .rows import JobStatus

JOB_PROMOTE_DUE = statement(
    "job_promote_due",
    """
WITH due AS (
    SELECT id FROM __schema__.jobs WHERE status = 'SCHEDULED' AND run_at <= now()
    ORDER BY run_at LIMIT $1 FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE __schema__.jobs j SET status = 'PENDING', updated_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.job_type, j.priority
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM upd
)
SELECT count(*) FROM upd
""",
)

# Expired leases: the worker died or hung. With retries left the job waits in a holding pen for
# the default exponential backoff (2^n s with jitter over the upper half, snapped up to the pen
# ladder ``$3``), so a job that crashes its worker does not hit the fleet again every lease
# period; otherwise it fails and is dead-lettered. A pending cancellation wins. ``retry_count``
# counts retries performed: it never exceeds ``max_retries``. An IN_PROGRESS job without a lease
# was not claimed by a worker (an operator's UPDATE): it is recovered the same way, and since
# its attempt number was not advanced, its attempt row may exist already (kept, not replaced).
_HAS_RETRY = "j.retry_count < COALESCE(j.max_retries, $2)"
_RECORD_EXPIRED = record("CASE WHEN status = 'CANCELLED' THEN 'cancelled' ELSE 'lease_expired' END")
JOB_RECOVER_EXPIRED = statement(
    "job_recover_expired",
    f"""
WITH exp AS (
    SELECT id, (SELECT COALESCE(min(p) FILTER (WHERE p >= d.secs), max(p))
                FROM unnest($3::int4[]) p) AS delay, COALESCE(run_at, created_at) AS due
    FROM __schema__.jobs jj,
         LATERAL (SELECT least(2.0 ^ (jj.retry_count + 1), 3600.0) * (0.5 + random() / 2)
                  AS secs) d
    WHERE status = 'IN_PROGRESS' AND (lease_expires_at < now() OR lease_expires_at IS NULL)
    ORDER BY lease_expires_at NULLS FIRST LIMIT $1 FOR UPDATE OF jj SKIP LOCKED
), upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED'
                       WHEN {_HAS_RETRY} THEN 'RETRYING'
                       ELSE 'FAILED' END)::__schema__.job_status,
        retry_count = j.retry_count + (CASE WHEN NOT j.cancel_requested AND {_HAS_RETRY}
                                            THEN 1 ELSE 0 END),
        last_error = CASE WHEN j.lease_expires_at IS NULL
                          THEN 'IN_PROGRESS without a lease (not a worker''s claim) at attempt '
                          ELSE 'lease expired: worker ' || COALESCE(j.worker_id, '?')
                               || ' stopped heartbeating during attempt ' END || j.attempts,
        run_at = CASE WHEN NOT j.cancel_requested AND {_HAS_RETRY}
                      THEN now() + make_interval(secs => exp.delay) ELSE j.run_at END,
        finished_at = CASE WHEN j.cancel_requested OR NOT {_HAS_RETRY} THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM exp WHERE j.id = exp.id
    RETURNING {finished("exp.due")}, j.priority, j.last_error, j.last_error AS error, exp.delay
), att AS (
    {_RECORD_EXPIRED} ON CONFLICT DO NOTHING
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds,
                                       error, attempt)
    SELECT id, job_type, priority, CASE WHEN status = 'FAILED' THEN 'dead' ELSE 'retry' END,
           CASE WHEN status = 'RETRYING' THEN delay END,
           CASE WHEN status = 'FAILED' THEN last_error END,
           CASE WHEN status = 'FAILED' THEN attempts END
    FROM upd WHERE status IN ('RETRYING', 'FAILED')
)
SELECT id, status::text AS status, job_type FROM upd
""",
)

# A waiting job (PENDING/RETRYING) with a lease in the future is *held*: a worker has its delivery
# in hand, waiting for a slot (``job_touch_waiting``), or a type limit sent it through a holding
# pen (``job_claim_controlled``). Its message is not among the queue's ready ones, and it is not
# lost: the reconciler counts it neither as overdue nor as fresh. Held is for a bounded time only
# (a holder that dies stops renewing it; a pen's hold ends with its delay plus a lease).
UNHELD = "(j.lease_expires_at IS NULL OR j.lease_expires_at <= now())"

# Jobs that should have reached a worker long ago and have no outbox row in flight: counted per
# type, so the reconciler can compare with the broker's queue depth before re-publishing. The
# overdue jobs are found first (``jobs_waiting_idx``, an empty range when all is well) and only
# then checked against the outbox: a hash of a large outbox (a relay that fell behind) is built
# only when some job is overdue, not on every idle pass.
JOB_COUNT_OVERDUE = statement(
    "job_count_overdue",
    f"""
WITH c AS MATERIALIZED (
    SELECT id, job_type FROM __schema__.jobs j
    WHERE j.status IN ('PENDING', 'RETRYING')
      AND j.updated_at < now() - make_interval(secs => $1)
      AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $1)) AND {UNHELD}
)
SELECT job_type, count(*) AS n FROM c
WHERE NOT EXISTS (SELECT 1 FROM __schema__.job_outbox o WHERE o.job_id = c.id)
GROUP BY job_type
""",
)

# The recount under a type's reconcile lock, in one snapshot: its overdue jobs (as above) and its
# *fresh* ones: due now (``run_at`` passed; a job in a holding pen is not in the work queue) but
# not overdue, with no outbox row; held jobs are neither. Only the ready messages beyond the
# fresh jobs can stand for overdue ones (``Sweeper.reconcile``). Reads the waiting jobs
# (``jobs_waiting_idx``, partial: PENDING/RETRYING only) of a type the idle count found overdue
# jobs of: an idle pass never runs it.
JOB_RECOUNT_OVERDUE = statement(
    "job_recount_overdue",
    f"""
WITH w AS MATERIALIZED (
    SELECT id, (j.updated_at < now() - make_interval(secs => $2)
                AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $2))) AS late
    FROM __schema__.jobs j
    WHERE j.job_type = $1 AND j.status IN ('PENDING', 'RETRYING')
      AND (j.run_at IS NULL OR j.run_at <= now()) AND {UNHELD}
)
SELECT count(*) FILTER (WHERE late) AS overdue, count(*) FILTER (WHERE NOT late) AS fresh
FROM w WHERE NOT EXISTS (SELECT 1 FROM __schema__.job_outbox o WHERE o.job_id = w.id)
""",
)

JOB_REPUBLISH_OVERDUE = statement(
    "job_republish_overdue",
    f"""
WITH o AS (
    SELECT id FROM __schema__.jobs j
    WHERE j.job_type = $1 AND j.status IN ('PENDING', 'RETRYING')
      AND j.updated_at < now() - make_interval(secs => $2)
      AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $2))
      AND NOT EXISTS (SELECT 1 FROM __schema__.job_outbox x WHERE x.job_id = j.id)
      AND {UNHELD} AND j.id = ANY($4::uuid[])
    ORDER BY j.updated_at LIMIT $3 FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE __schema__.jobs j SET updated_at = now() FROM o WHERE j.id = o.id
    RETURNING j.id, j.job_type, j.priority
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM upd
)
SELECT count(*) FROM upd
""",
)

# The oldest overdue jobs of a type: the reconciler's suspects, re-published by its next pass
# only if they are still overdue then.
JOB_OVERDUE_IDS = statement(
    "job_overdue_ids",
    f"""
SELECT id FROM __schema__.jobs j
WHERE j.job_type = $1 AND j.status IN ('PENDING', 'RETRYING')
  AND j.updated_at < now() - make_interval(secs => $2)
  AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $2))
  AND NOT EXISTS (SELECT 1 FROM __schema__.job_outbox x WHERE x.job_id = j.id) AND {UNHELD}
ORDER BY j.updated_at LIMIT $3
""",
)

# A sweeper duty's transaction that takes locks other sweepers wait for or skip (the schedules
# pass, a type's reconcile) opens with this: PostgreSQL ends the session of a sweeper that sits
# idle inside it for $1 (paused: a frozen VM, a long GC; its connection stays open, so nothing
# else would release the locks) and fails any lock wait after $2. SET LOCAL: both end with the
# transaction. Also reads the clock, so the bound costs no extra round trip.
MAINTENANCE_BOUND = statement(
    "maintenance_bound",
    """
SELECT clock_timestamp() AS now,
       set_config('idle_in_transaction_session_timeout', $1, true) AS idle,
       set_config('lock_timeout', $2, true) AS lock_wait
""",
)

# One replica at a time reconciles a type: the lock is held by the transaction that recounts and
# re-publishes, so a replica cannot add its own copy of a shortfall another one is filling.
JOB_RECONCILE_LOCK = statement(
    "job_reconcile_lock",
    "SELECT pg_try_advisory_xact_lock(hashtextextended('__schema__:reconcile:' || $1, 0))",
)

# Retention, in small batches, oldest first: COMPLETED/CANCELLED jobs finished more than ``$1``
# seconds ago (``jobs_done_idx``) and FAILED ones more than ``$2`` seconds ago
# (``jobs_failed_idx``); an idle pass reads an empty range of each. A job's attempts go with it
# (``job_attempts`` has no foreign key, see ``schema.py``).
JOB_DELETE_EXPIRED = statement(
    "job_delete_expired",
    """
WITH done AS (
    SELECT id FROM __schema__.jobs WHERE status IN ('COMPLETED', 'CANCELLED')
      AND finished_at < now() - make_interval(secs => $1)
    ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED
), failed AS (
    SELECT id FROM __schema__.jobs WHERE status = 'FAILED'
      AND finished_at < now() - make_interval(secs => $2)
    ORDER BY finished_at LIMIT greatest($3 - (SELECT count(*) FROM done), 0) FOR UPDATE SKIP LOCKED
), d AS (
    SELECT id FROM done UNION ALL SELECT id FROM failed
), a AS (
    DELETE FROM __schema__.job_attempts a USING d WHERE a.job_id = d.id
)
DELETE FROM __schema__.jobs j USING d WHERE j.id = d.id
""",
)


class MaintenanceStatements(Statements):
    async def job_promote_due(self, conn: Connection, *, limit: int) -> int:
        """SCHEDULED jobs whose ``run_at`` passed (database clock) → PENDING + outbox rows."""
        return int(await conn.fetchval(self.sql[JOB_PROMOTE_DUE], limit))

    async def job_recover_expired(
        self, conn: Connection, *, limit: int, default_max_retries: int
    ) -> list[JobStatus]:
        """IN_PROGRESS jobs whose lease expired → RETRYING (through a holding pen, after the
        default backoff), FAILED or CANCELLED."""
        rows = await conn.fetch(
            self.sql[JOB_RECOVER_EXPIRED], limit, default_max_retries, list(PEN_LADDER)
        )
        return [JobStatus(r["id"], Status(r["status"]), r["job_type"]) for r in rows]

    async def job_count_overdue(self, conn: Connection, *, after: float) -> dict[str, int]:
        """Per type, PENDING/RETRYING jobs untouched for ``after`` seconds with no outbox row."""
        rows = await conn.fetch(self.sql[JOB_COUNT_OVERDUE], after)
        return {r["job_type"]: int(r["n"]) for r in rows}

    async def job_recount_overdue(
        self, conn: Connection, job_type: str, *, after: float
    ) -> tuple[int, int]:
        """``job_type``'s overdue jobs and its fresh ones (due, not overdue), no outbox row."""
        r = await conn.fetchrow(self.sql[JOB_RECOUNT_OVERDUE], job_type, after)
        return int(r["overdue"]), int(r["fresh"])

    async def job_republish_overdue(
        self,
        conn: Connection,
        job_type: str,
        *,
        after: float,
        limit: int,
        among: Sequence[uuid.UUID],
    ) -> int:
        """Give up to ``limit`` of the jobs ``among`` that are still overdue a new outbox row."""
        return int(
            await conn.fetchval(
                self.sql[JOB_REPUBLISH_OVERDUE], job_type, after, limit, list(among)
            )
        )

    async def job_overdue_ids(
        self, conn: Connection, job_type: str, *, after: float, limit: int
    ) -> list[uuid.UUID]:
        """The ``limit`` oldest overdue jobs of ``job_type`` (no outbox row, untouched)."""
        rows = await conn.fetch(self.sql[JOB_OVERDUE_IDS], job_type, after, limit)
        return [r["id"] for r in rows]

    async def maintenance_bound(
        self, conn: Connection, *, idle: float, lock_wait: float
    ) -> datetime:
        """First in a duty's transaction: the session ends after ``idle`` seconds idle inside
        it, a lock wait fails after ``lock_wait`` seconds (see ``MAINTENANCE_BOUND``). Returns
        the database's clock."""
        value: datetime = await conn.fetchval(
            self.sql[MAINTENANCE_BOUND], f"{round(idle * 1000)}ms", f"{round(lock_wait * 1000)}ms"
        )
        return value

    async def job_reconcile_lock(self, conn: Connection, job_type: str) -> bool:
        """Take ``job_type``'s reconcile lock until the transaction ends; False when another
        replica holds it (it is reconciling that type right now)."""
        return bool(await conn.fetchval(self.sql[JOB_RECONCILE_LOCK], job_type))

    async def job_delete_expired(
        self, conn: Connection, *, older_than: float, failed_older_than: float, limit: int
    ) -> int:
        """Delete up to ``limit`` COMPLETED/CANCELLED jobs finished more than ``older_than``
        seconds ago and FAILED jobs finished more than ``failed_older_than`` seconds ago."""
        return affected(
            await conn.execute(self.sql[JOB_DELETE_EXPIRED], older_than, failed_older_than, limit)
        )
