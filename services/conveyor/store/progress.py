"""Writes a running attempt makes besides its outcome: progress reports, and the check that lets
its follow-up jobs in (``worker/followups.py``). Both are fenced by (job id, attempt)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Connection, Statements
from .registry import named

JOB_PROGRESS_MANY = named("job_progress_many")
JOB_COMPLETED_AMONG = named("job_completed_among")


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
