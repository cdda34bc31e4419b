"""operator SQL: the supported writes as functions, and ``stuck_jobs`` without a lease

- ``retry_job(id)``: what an operator means by "set it back to PENDING", done whole: a FAILED or
  CANCELLED job is redriven as ``POST /jobs/{id}/retry`` does (fresh retries, back to SCHEDULED
  when it never ran and its ``run_at`` is ahead); a PENDING or RETRYING job is published now,
  its status kept (a hold or a pen's remaining delay dropped), and a SCHEDULED one made PENDING
  now: only transitions of ``core.jobs.TRANSITIONS``. Either way with an outbox row and a
  NOTIFY, so the relay publishes it at once instead of the reconciler 75-90 s later. An
  IN_PROGRESS job is refused (a re-run would fence the running attempt's result away: cancel it
  instead) and so is a COMPLETED one (a re-run would replace its result: submit a new job).
  Returns the new status, NULL for no such job.
- ``cancel_job(id)``: ``POST /jobs/{id}/cancel``: a waiting job is CANCELLED; a running one is
  asked to stop (its status stays IN_PROGRESS until its attempt ends). Returns the status after
  the call, NULL when the job is finished or missing.
- ``stuck_jobs`` also lists IN_PROGRESS jobs with no lease at all (set by hand, never claimed):
  lease recovery puts them back too (``store/maintenance.py``).

Both functions are ``SECURITY INVOKER``: a role needs the same rights as for the UPDATE itself.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STUCK = """
SELECT id, job_type AS type, worker_id, attempts AS attempt, started_at, lease_expires_at,
       now() - COALESCE(lease_expires_at, updated_at) AS overdue
FROM {s}.jobs
WHERE status = 'IN_PROGRESS' AND (lease_expires_at < now() OR lease_expires_at IS NULL)
"""

STUCK_BEFORE = """
SELECT id, job_type AS type, worker_id, attempts AS attempt, started_at, lease_expires_at,
       now() - lease_expires_at AS overdue
FROM {s}.jobs
WHERE status = 'IN_PROGRESS' AND lease_expires_at < now()
"""

RETRY_JOB = """
CREATE FUNCTION {s}.retry_job(job_id uuid) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    j {s}.jobs%ROWTYPE;
    new_status text;
BEGIN
    SELECT * INTO j FROM {s}.jobs WHERE id = job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF j.status = 'IN_PROGRESS' THEN
        RAISE EXCEPTION 'job % is IN_PROGRESS: a re-run now would throw away the running '
            'attempt''s result; cancel it with {s}.cancel_job(), or let it finish', job_id;
    ELSIF j.status = 'COMPLETED' THEN
        RAISE EXCEPTION 'job % is COMPLETED: a re-run would replace its result; submit a new '
            'job instead', job_id;
    END IF;
    new_status := CASE WHEN j.status = 'CANCELLED' AND j.attempts = 0 AND j.run_at > now()
                       THEN 'SCHEDULED' WHEN j.status = 'RETRYING' THEN 'RETRYING'
                       ELSE 'PENDING' END;
    UPDATE {s}.jobs SET
        status = new_status::{s}.job_status,
        run_at = CASE WHEN new_status = 'SCHEDULED' THEN run_at
                      WHEN j.status IN ('FAILED', 'CANCELLED') THEN NULL
                      WHEN run_at > now() THEN now() ELSE run_at END,
        retry_count = CASE WHEN j.status IN ('FAILED', 'CANCELLED') THEN 0 ELSE retry_count END,
        cancel_requested = false,
        result = NULL, finished_at = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE id = job_id;
    IF new_status <> 'SCHEDULED' AND NOT EXISTS (
        SELECT 1 FROM {s}.job_outbox o WHERE o.job_id = j.id AND o.destination = 'work'
    ) THEN
        INSERT INTO {s}.job_outbox (job_id, job_type, priority)
        VALUES (j.id, j.job_type, j.priority);
        PERFORM pg_notify('{s}_outbox', '');
    END IF;
    RETURN new_status;
END
$fn$
"""

CANCEL_JOB = """
CREATE FUNCTION {s}.cancel_job(job_id uuid) RETURNS text LANGUAGE sql AS $fn$
UPDATE {s}.jobs SET
    status = (CASE WHEN status = 'IN_PROGRESS' THEN 'IN_PROGRESS' ELSE 'CANCELLED' END)
             ::{s}.job_status,
    cancel_requested = true,
    finished_at = CASE WHEN status = 'IN_PROGRESS' THEN NULL ELSE now() END,
    lease_expires_at = CASE WHEN status = 'IN_PROGRESS' THEN lease_expires_at END,
    run_at = CASE WHEN status IN ('SCHEDULED', 'IN_PROGRESS') THEN run_at END,
    updated_at = now()
WHERE id = job_id AND status IN ('PENDING', 'SCHEDULED', 'RETRYING', 'IN_PROGRESS')
RETURNING status::text
$fn$
"""


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    assert schema is not None
    op.execute(f"CREATE OR REPLACE VIEW {schema}.stuck_jobs AS {STUCK.format(s=schema)}")
    op.execute(RETRY_JOB.format(s=schema))
    op.execute(CANCEL_JOB.format(s=schema))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"DROP FUNCTION IF EXISTS {schema}.cancel_job(uuid)")
    op.execute(f"DROP FUNCTION IF EXISTS {schema}.retry_job(uuid)")
    op.execute(f"CREATE OR REPLACE VIEW {schema}.stuck_jobs AS {STUCK_BEFORE.format(s=schema)}")
