"""Attempt history: the fragment every finishing statement appends (one INSERT into
``job_attempts`` in the same statement, so the hot path takes no extra round trip) and the
reads of one job's attempts.

A finishing statement's ``upd`` CTE returns ``finished()`` (given the due time it read before
the update when it rewrites ``run_at``) plus ``error``; ``record`` turns those rows into attempt
rows. The attempt still running is not in ``job_attempts``: it
is read from its ``jobs`` row (attempt number, worker, start), which the claim already wrote."""

from __future__ import annotations

import uuid

from .base import Connection, Statements
from .registry import named
from .rows import AttemptRow


def finished(due: str = "COALESCE(j.run_at, j.created_at)") -> str:
    """Columns of the updated job (``j``) that an attempt row needs. ``due``: when the attempt
    could have started (``run_at`` for scheduled and retried jobs, else ``created_at``); a
    statement that rewrites ``run_at`` passes the due time it read before the update."""
    return f"j.id, j.job_type, j.attempts, j.worker_id, j.started_at, j.status, {due} AS due"


FINISHED = finished()


def record(outcome_sql: str) -> str:
    """The INSERT of one attempt row per row of ``upd``; ``outcome_sql`` maps the job's new
    ``status`` to the attempt's outcome. No ``ON CONFLICT`` (a speculative insertion costs more):
    every write after a claim is fenced by (job, attempt) and moves the job out of IN_PROGRESS,
    so an attempt finishes at most once."""
    return f"""INSERT INTO __schema__.job_attempts (job_id, attempt, job_type, worker_id,
        started_at, finished_at, outcome, error, duration_seconds, wait_seconds)
    SELECT id, attempts, job_type, worker_id, started_at, now(), {outcome_sql}, error,
           extract(epoch FROM now() - started_at)::float8,
           greatest(0, extract(epoch FROM started_at - due))::float8
    FROM upd"""


JOB_ATTEMPT_LIST = named("job_attempt_list")


class HistoryStatements(Statements):
    async def job_attempt_list(
        self, conn: Connection, job_id: uuid.UUID
    ) -> list[AttemptRow] | None:
        """Every attempt of a job, oldest first (the running one with ``outcome`` None); None
        when there is no such job."""
        rows = await conn.fetch(self.sql[JOB_ATTEMPT_LIST], job_id)
        if not rows:
            return None
        return [
            AttemptRow(
                attempt=r["attempt"],
                worker_id=r["worker_id"],
                started_at=r["started_at"],
                finished_at=r["finished_at"],
                outcome=r["outcome"],
                error=r["error"],
                duration_seconds=r["duration_seconds"],
            )
            for r in rows
            if r["attempt"] is not None
        ]
