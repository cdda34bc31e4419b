"""Writes a running attempt makes besides its outcome: progress reports, and the check that lets
its follow-up jobs in (``worker/followups.py``). Both are fenced by (job id, attempt)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from .attempts import RUNNING
from .base import Connection, Statements
from .registry import statement

# Fenced like every write of an attempt: a stale attempt's report changes nothing.
JOB_PROGRESS_MANY = statement(
    "job_progress_many",
    f"""
UPDATE __schema__.jobs j SET
    progress = jsonb_build_object('percent', u.percent, 'message', u.message,
                                  'updated_at', now())
FROM unnest($1::uuid[], $2::int4[], $3::float8[], $4::text[])
    AS u(id, attempt, percent, message)
WHERE j.id = u.id AND j.attempts = u.attempt AND {RUNNING}
RETURNING j.id
""",
)

# In the completing transaction, after ``job_complete_many``: which of the attempts it wrote
# ended COMPLETED (not CANCELLED by a cancel requested while they ran).
JOB_COMPLETED_AMONG = statement(
    "job_completed_among",
    """
SELECT j.id FROM __schema__.jobs j
JOIN unnest($1::uuid[], $2::int4[]) AS u(id, attempt) ON j.id = u.id
WHERE j.attempts = u.attempt AND j.status = 'COMPLETED'
""",
)


@dataclass(frozen=True, slots=True)
class ProgressReport:
    job_id: uuid.UUID
    attempt: int
    percent: float
    message: str | None


class ProgressStatements(Statements):
    async def job_progress_many(
        self, conn: Connection, reports: Sequence[ProgressReport]
    ) -> set[uuid.UUID]:
        """Returns the jobs written (a stale or finished attempt's report is not)."""
        rows = await conn.fetch(
            self.sql[JOB_PROGRESS_MANY],
            [r.job_id for r in reports],
            [r.attempt for r in reports],
            [r.percent for r in reports],
            [r.message for r in reports],
        )
        return {r["id"] for r in rows}

    async def job_completed_among(
        self, conn: Connection, attempts: Sequence[tuple[uuid.UUID, int]]
    ) -> set[uuid.UUID]:
        rows = await conn.fetch(
            self.sql[JOB_COMPLETED_AMONG], [a[0] for a in attempts], [a[1] for a in attempts]
        )
        return {r["id"] for r in rows}
