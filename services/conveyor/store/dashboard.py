"""The dashboard's reads and bulk actions. Each is served by an index, even with millions of
jobs (``tests/integration/test_explain.py``): job types by a skip scan of
``jobs_type_status_id_idx``, one (type, status) range each; job pages by keyset on the UUIDv7
``id`` (a time filter is an ``id`` range); the last hour from ``job_attempts``' BRIN index."""

from __future__ import annotations

import uuid
from typing import Any

from .base import Connection, Statements, affected
from .jobs import JOB_COLUMNS
from .registry import statement
from .rows import JobRow

# Dead letters are grouped by the error's first line (the exception and its message, without
# the traceback), cut at 160 characters.
ERROR_KEY = "left(split_part(COALESCE(last_error, ''), E'\\n', 1), 160)"

JOB_OVERVIEW_HOUR = statement(
    "job_overview_hour",
    """
SELECT job_type AS type,
       count(*) FILTER (WHERE outcome = 'completed') AS completed,
       count(*) FILTER (WHERE outcome = 'failed') AS failed,
       count(*) FILTER (WHERE outcome IN ('retry', 'lease_expired')) AS retried,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_seconds) AS wait_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_seconds) AS wait_p95
FROM __schema__.job_attempts
WHERE finished_at > now() - interval '1 hour'
GROUP BY job_type ORDER BY job_type
""",
)

_TYPES = """WITH RECURSIVE t(job_type) AS (
    SELECT min(job_type) FROM __schema__.jobs
    UNION ALL
    SELECT (SELECT min(j.job_type) FROM __schema__.jobs j WHERE j.job_type > t.job_type)
    FROM t WHERE t.job_type IS NOT NULL
)"""

# Newest first; ``$3``/``$4``: id bounds (keyset cursor, time window as UUIDv7 bounds). Without
# a filter the primary key serves the order. With a type and/or a status, each (type, status)
# range of ``jobs_type_status_id_idx`` is read newest first, at most ``$5`` rows each, and the
# ranges are merged: a rare type or status never walks the whole primary key. The bounds are
# COALESCEd to the extreme UUIDs rather than ``$3 IS NULL OR id < $3``: a generic plan (a
# prepared statement's sixth execution on) then still seeks the cursor in the index instead of
# filtering every newer row on the way to it. The ranges yield ids only (index-only), and the
# page's rows are then looked up by id: read whole, a range's rows cost a heap fetch each, and
# when the statistics had seen no backlog the planner preferred walking the primary key back
# from the cursor, filtering type and status, to find them (a rare pair: half the table).
JOB_PAGE = statement(
    "job_page",
    f"""
SELECT {JOB_COLUMNS} FROM __schema__.jobs
WHERE id < COALESCE($3::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
  AND id >= COALESCE($4::uuid, '00000000-0000-0000-0000-000000000000')
  AND $1::text IS NULL AND $2::text IS NULL
ORDER BY id DESC
LIMIT $5
""",
)

JOB_PAGE_FILTERED = statement(
    "job_page_filtered",
    f"""
{
        _TYPES.replace(
            "SELECT min(job_type) FROM", "SELECT COALESCE($1::text, min(job_type)) FROM"
        ).replace("WHERE t.job_type IS NOT NULL", "WHERE t.job_type IS NOT NULL AND $1 IS NULL")
    }, page AS (
    SELECT x.id FROM t
    CROSS JOIN unnest(CASE WHEN $2::text IS NULL THEN enum_range(NULL::__schema__.job_status)
                           ELSE ARRAY[$2::__schema__.job_status] END) AS st(status)
    CROSS JOIN LATERAL (
        SELECT id FROM __schema__.jobs
        WHERE job_type = t.job_type AND status = st.status
          AND id < COALESCE($3::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
          AND id >= COALESCE($4::uuid, '00000000-0000-0000-0000-000000000000')
        ORDER BY id DESC LIMIT $5
    ) x
    WHERE t.job_type IS NOT NULL
    ORDER BY x.id DESC
    LIMIT $5
)
SELECT {JOB_COLUMNS} FROM __schema__.jobs
WHERE id = ANY(ARRAY(SELECT id FROM page))
ORDER BY id DESC
""",
)

JOB_DEAD_GROUPS = statement(
    "job_dead_groups",
    f"""
{_TYPES}
SELECT t.job_type AS type, g.error, g.count, g.last_failed
FROM t CROSS JOIN LATERAL (
    SELECT {ERROR_KEY} AS error, count(*) AS count, max(finished_at) AS last_failed
    FROM __schema__.jobs j WHERE j.job_type = t.job_type AND j.status = 'FAILED'
    GROUP BY 1
) g
WHERE t.job_type IS NOT NULL
ORDER BY g.count DESC, t.job_type, g.error
LIMIT 500
""",
)

_DEAD_FILTER = f"""SELECT id FROM __schema__.jobs
    WHERE job_type = $1 AND status = 'FAILED' AND ($2::text IS NULL OR {ERROR_KEY} = $2)
    LIMIT $3 FOR UPDATE SKIP LOCKED"""

JOB_DEAD_COUNT = statement(
    "job_dead_count",
    f"""SELECT count(*) FROM __schema__.jobs
    WHERE job_type = $1 AND status = 'FAILED' AND ($2::text IS NULL OR {ERROR_KEY} = $2)""",
)

# Redrive by filter through the store: FAILED → PENDING with fresh retries and an outbox row.
# Their copies in the dead-letter queue stay; `conveyor dlq` drops a copy whose job is no longer
# FAILED.
JOB_REDRIVE_DEAD = statement(
    "job_redrive_dead",
    f"""
WITH d AS ({_DEAD_FILTER}), r AS (
    UPDATE __schema__.jobs j SET status = 'PENDING', retry_count = 0, cancel_requested = false,
        result = NULL, finished_at = NULL, run_at = NULL, lease_expires_at = NULL,
        updated_at = now()
    FROM d WHERE j.id = d.id
    RETURNING j.id, j.job_type, j.priority
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM r
)
SELECT count(*) FROM r
""",
)

JOB_PURGE_DEAD = statement(
    "job_purge_dead",
    f"""
WITH d AS ({_DEAD_FILTER}), a AS (
    DELETE FROM __schema__.job_attempts a USING d WHERE a.job_id = d.id
)
DELETE FROM __schema__.jobs j USING d WHERE j.id = d.id
""",
)


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
        rows = await conn.fetch(self.sql[name], job_type, status, before, since, limit)
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
