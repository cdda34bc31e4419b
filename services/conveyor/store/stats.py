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
from .registry import statement

JOB_BACKLOG = statement(
    "job_backlog",
    "SELECT type, status::text AS status, count, oldest FROM __schema__.backlog",
)

# The backlog view's skip scan over the types, with each count stopped at the cap: one branch
# per status, the status a constant in each. As a parameter (a loop over the statuses) the
# planner had to guess a pair's rows, 1/n_distinct of the type's, and when the statistics had
# seen no PENDING or running job (a quiet install analysed at night: four statuses) or were
# older than the table (a bulk load), the guess was large enough that "a sequential scan, or a
# walk of the primary key, stopped after $1 matching rows" looked cheap: it read the whole table
# for every empty pair, ~8 s a refresh at 10 million rows. A constant is estimated from the
# statistics (a status they never saw: one row), so the pair's range of the (type, status, id)
# index is the plan. ``ORDER BY j.id`` does not pin it: the equalities make (type, status)
# redundant in the ordering, and the primary key supplies ``id`` order.
# the statuses of the ``backlog`` view: every one but COMPLETED and CANCELLED
_COUNTED = [s.value for s in Status if s not in (Status.COMPLETED, Status.CANCELLED)]
COUNTED_STATUSES = tuple(_COUNTED)
_CAPPED_BRANCH = """SELECT '{status}'::text AS status, count(*) AS n
        FROM (SELECT FROM __schema__.jobs j
              WHERE j.job_type = t.job_type AND j.status = '{status}' LIMIT $1) x"""
_CAPPED_BRANCHES = "\n    UNION ALL ".join(_CAPPED_BRANCH.format(status=s) for s in _COUNTED)
JOB_COUNTS_CAPPED = statement(
    "job_counts_capped",
    f"""
WITH RECURSIVE t(job_type) AS (
    SELECT min(job_type) FROM __schema__.jobs
    UNION ALL
    SELECT (SELECT min(j.job_type) FROM __schema__.jobs j WHERE j.job_type > t.job_type)
    FROM t WHERE t.job_type IS NOT NULL
)
SELECT t.job_type AS type, c.status, c.n
FROM t
CROSS JOIN LATERAL (
    {_CAPPED_BRANCHES}
) c
WHERE t.job_type IS NOT NULL AND c.n > 0
""",
)

# Planning only (EXPLAIN without ANALYZE runs nothing): the bound values are planned as
# constants, so the estimate is the one of this type and status.
JOB_COUNT_ESTIMATE = statement(
    "job_count_estimate",
    """
EXPLAIN (FORMAT JSON) SELECT FROM __schema__.jobs
WHERE job_type = $1 AND status = $2::__schema__.job_status
""",
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
