"""The dashboard's reads and bulk actions. Each is served by an index, even with millions of
jobs (``tests/integration/test_explain.py``): job types by a skip scan of
``jobs_type_status_id_idx``, one (type, status) range each; job pages by keyset on the UUIDv7
``id`` (a time filter is an ``id`` range); the last hour from ``job_attempts``' BRIN index."""

from __future__ import annotations

import uuid
from typing import Any

from .base import Connection, Statements, affected
from .registry import bind, named
from .rows import JobRow

JOB_OVERVIEW_HOUR = named("job_overview_hour")
JOB_PAGE = named("job_page")
JOB_PAGE_FILTERED = named("job_page_filtered")
JOB_DEAD_GROUPS = named("job_dead_groups")
JOB_DEAD_COUNT = named("job_dead_count")
JOB_REDRIVE_DEAD = named("job_redrive_dead")
JOB_PURGE_DEAD = named("job_purge_dead")


class DashboardStatements(Statements):
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
