"""Counts for gauges, the operator views and the dashboard, and the dashboard's reads and bulk
actions. Each read is served by an index (``tests/integration/test_explain.py`` checks the plans
on a million generated rows), even with millions of jobs: job types by a skip scan of
``jobs_type_status_id_idx``, one (type, status) range each; job pages by keyset on the UUIDv7
``id`` (a time filter is an ``id`` range); the last hour from ``job_attempts``' BRIN index.

The gauges' job counts are exact up to a cap and estimated above it (docs/monitoring.md):
``JOB_COUNTS_CAPPED`` counts each (type, status) with an index-only scan that stops after ``$1``
rows, so a refresh reads at most the cap per pair however big the backlog;
``JOB_COUNT_ESTIMATE`` asks the planner for the rows of one pair (``reltuples`` scaled to the
table's current size times the joint frequency in the ``jobs_type_status`` statistics,
schema/jobs.sql), which costs a plan, not a scan."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from ..core.jobs import Status
from .base import Connection, Statements, affected
from .registry import bind, named
from .rows import JobRow

JOB_BACKLOG = named("job_backlog")

# The statuses the ``backlog`` view counts (every one but COMPLETED and CANCELLED), one branch
# each in ``job_counts_capped``.
COUNTED_STATUSES = tuple(s.value for s in Status if s not in (Status.COMPLETED, Status.CANCELLED))
JOB_COUNTS_CAPPED = named("job_counts_capped")
JOB_COUNT_ESTIMATE = named("job_count_estimate")
OUTBOX_STATS = named("outbox_stats")
JOB_STUCK_COUNT = named("job_stuck_count")
JOB_OVERVIEW_HOUR = named("job_overview_hour")
JOB_PAGE = named("job_page")
JOB_PAGE_FILTERED = named("job_page_filtered")
JOB_DEAD_GROUPS = named("job_dead_groups")
JOB_DEAD_COUNT = named("job_dead_count")
JOB_REDRIVE_DEAD = named("job_redrive_dead")
JOB_PURGE_DEAD = named("job_purge_dead")


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

    async def job_overview_hour(self, conn: Connection) -> list[dict[str, Any]]:
        """Per type over the last hour: attempts completed, failed, retried; wait p50/p95."""
        return [dict(r) for r in await conn.fetch(self.sql[JOB_OVERVIEW_HOUR])]

    async def job_page(
        self,
        conn: Connection,
        *,
        job_type: str | None,
        status: str | None,
        before: uuid.UUID | None,
        since: uuid.UUID | None,
        limit: int,
    ) -> list[JobRow]:
        name = JOB_PAGE if job_type is None and status is None else JOB_PAGE_FILTERED
        values = {
            "job_type": job_type,
            "status": status,
            "before": before,
            "since": since,
            "limit": limit,
        }
        rows = await conn.fetch(self.sql[name], *bind(name, values))
        return [JobRow.from_record(r) for r in rows]

    async def job_list(
        self,
        conn: Connection,
        *,
        job_type: str | None,
        status: str | None,
        after: uuid.UUID | None,
        limit: int,
    ) -> list[JobRow]:
        """GET /jobs: newest first, keyset on the UUIDv7 ``id`` (``after``: the cursor)."""
        return await self.job_page(
            conn, job_type=job_type, status=status, before=after, since=None, limit=limit
        )

    async def job_dead_groups(self, conn: Connection) -> list[dict[str, Any]]:
        """FAILED jobs by type and error prefix, largest groups first."""
        return [dict(r) for r in await conn.fetch(self.sql[JOB_DEAD_GROUPS])]

    async def job_dead_count(self, conn: Connection, job_type: str, error: str | None) -> int:
        return int(await conn.fetchval(self.sql[JOB_DEAD_COUNT], job_type, error))

    async def job_redrive_dead(
        self, conn: Connection, job_type: str, error: str | None, *, limit: int
    ) -> int:
        return int(await conn.fetchval(self.sql[JOB_REDRIVE_DEAD], job_type, error, limit))

    async def job_purge_dead(
        self, conn: Connection, job_type: str, error: str | None, *, limit: int
    ) -> int:
        return affected(await conn.execute(self.sql[JOB_PURGE_DEAD], job_type, error, limit))
