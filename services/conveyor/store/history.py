"""Attempt history: the reads of one job's attempts. Each finishing statement (``sql/attempts.sql``,
``sql/maintenance.sql``) writes its attempt rows itself (one INSERT into ``job_attempts`` in the
same statement, so the hot path takes no extra round trip). The attempt still running is not in
``job_attempts``: it is read from its ``jobs`` row (attempt number, worker, start), which the
claim already wrote."""

from __future__ import annotations

import uuid

from .base import Connection, Statements
from .registry import named
from .rows import AttemptRow

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
