"""Counts for gauges, the operator views and the dashboard. Each read is served by an index
(``tests/integration/test_explain.py`` checks the plans on a million generated rows)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .base import Connection, Statements
from .registry import statement

JOB_BACKLOG = statement(
    "job_backlog",
    "SELECT type, status::text AS status, count, oldest FROM __schema__.backlog",
)

OUTBOX_STATS = statement(
    "outbox_stats",
    """
SELECT count(*) AS n, COALESCE(extract(epoch FROM now() - min(created_at)), 0)::float8 AS lag
FROM __schema__.job_outbox
""",
)

# Running jobs whose lease expired and that maintenance has not put back yet (the ``stuck_jobs``
# view: a range of ``jobs_lease_idx``); above 0 for minutes means lease recovery is not running.
JOB_STUCK_COUNT = statement("job_stuck_count", "SELECT count(*) AS n FROM __schema__.stuck_jobs")


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

    async def outbox_stats(self, conn: Connection) -> tuple[int, float]:
        """Rows waiting in the outbox and the age of the oldest, in seconds."""
        row = await conn.fetchrow(self.sql[OUTBOX_STATS])
        return int(row["n"]), float(row["lag"])

    async def job_stuck_count(self, conn: Connection) -> int:
        """Running jobs whose lease has expired (not yet recovered by maintenance)."""
        return int(await conn.fetchval(self.sql[JOB_STUCK_COUNT]))
