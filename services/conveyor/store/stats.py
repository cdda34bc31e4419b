"""Counts for gauges, the operator views and the dashboard. Each read is served by an index
(``tests/integration/test_explain.py`` checks the plans on a million generated rows).

The gauges' job counts are exact up to a cap and estimated above it (docs/monitoring.md):
``JOB_COUNTS_CAPPED`` counts each (type, status) with an index-only scan that stops after ``$1``
rows, so a refresh reads at most the cap per pair however big the backlog;
``JOB_COUNT_ESTIMATE`` asks the planner for the rows of one pair (``reltuples`` scaled to the
table's current size times the joint frequency in the ``jobs_type_status`` statistics of migration
0011), which costs a plan, not a scan."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import orjson

from ..core.jobs import Status
from .base import Connection, Statements
from .registry import named

JOB_BACKLOG = named("job_backlog")

# The statuses the ``backlog`` view counts (every one but COMPLETED and CANCELLED), one branch
# each in ``job_counts_capped``.
COUNTED_STATUSES = tuple(s.value for s in Status if s not in (Status.COMPLETED, Status.CANCELLED))
JOB_COUNTS_CAPPED = named("job_counts_capped")
JOB_COUNT_ESTIMATE = named("job_count_estimate")
OUTBOX_STATS = named("outbox_stats")
JOB_STUCK_COUNT = named("job_stuck_count")


@dataclass(frozen=True, slots=True)
class BacklogRow:
    job_type: str
    status: str
    count: int
    oldest: datetime


class StatsStatements(Statements):
    async def job_backlog(self, conn: Connection) -> list[BacklogRow]:
        """Jobs by type and status (not COMPLETED or CANCELLED), with the oldest's creation."""
        rows = await conn.fetch(self.sql[JOB_BACKLOG])
        return [BacklogRow(r["type"], r["status"], int(r["count"]), r["oldest"]) for r in rows]

    async def job_counts_capped(self, conn: Connection, cap: int) -> dict[tuple[str, str], int]:
        """Jobs by (type, status) for the live statuses and FAILED, each counted up to ``cap``
        (a pair without jobs is left out)."""
        rows = await conn.fetch(self.sql[JOB_COUNTS_CAPPED], cap)
        return {(r["type"], r["status"]): int(r["n"]) for r in rows}

    async def job_count_estimate(self, conn: Connection, job_type: str, status: str) -> int:
        """The planner's estimate of the jobs of ``job_type`` in ``status``."""
        plan = await conn.fetchval(self.sql[JOB_COUNT_ESTIMATE], job_type, status)
        return int(orjson.loads(plan)[0]["Plan"]["Plan Rows"])

    async def outbox_stats(self, conn: Connection) -> tuple[int, float]:
        """Rows waiting in the outbox and the age of the oldest, in seconds."""
        row = await conn.fetchrow(self.sql[OUTBOX_STATS])
        return int(row["n"]), float(row["lag"])

    async def job_stuck_count(self, conn: Connection) -> int:
        """Running jobs whose lease has expired (not yet recovered by maintenance)."""
        return int(await conn.fetchval(self.sql[JOB_STUCK_COUNT]))
