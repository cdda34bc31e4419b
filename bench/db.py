"""The SQL the harness runs: a fresh database, direct inserts for the relay and backfill steps,
and the cheap polls and measurements. Times that matter (latency, drain) come from PostgreSQL's
own clock."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

# The poll that ends a workload (every 50 ms): this run's finished no-op jobs, read through the
# index on finished_at (``jobs_done_idx``; ``jobs_finished_idx`` before the refactor), so it
# reads only the rows finished since the workload started. It was ``created_at >= $1``, for an
# index (job_type, status, created_at) that an earlier migration dropped: every poll then read
# every COMPLETED no-op row, ~22 ms at 20,000 rows and far more beside the 500k backfill, a
# load on PostgreSQL that grew with the run's length (the harness waits for an idle system
# between workloads, so no job created before ``$1`` finishes after it). The type test is
# ``job_type || ''`` so that no index can serve it: with no statistics on ``jobs`` (this
# machine's PostgreSQL runs with autovacuum off, and the run's database is new) the planner took
# ``job_type = 'noop' AND status = 'COMPLETED'`` for one row and walked every COMPLETED no-op
# job of the run in ``jobs_type_status_id_idx``, filtering ``finished_at``: in a full run's
# latency step (after 70,000 earlier jobs) 14,500 buffers per poll, 0.4 of a core, and the p99
# went from 8.6 ms (latency alone) to 14.5 ms.
COUNT_COMPLETED = """
SELECT count(*) FROM jobs
WHERE (job_type || '') = 'noop' AND status = 'COMPLETED' AND finished_at >= $1
"""

# The run's no-op jobs by status, through indexes (``created_at`` has none: beside the 10-million
# row step the filter read every no-op job, 0.3-1.4 s): the finished ones by ``finished_at``, the
# rest by (type, status). No job of an earlier workload finishes after ``$1`` (the harness waits
# for an idle system between workloads).
COUNT_BY_STATUS = """
SELECT status::text AS status, count(*) AS n FROM (
    SELECT status FROM jobs WHERE (job_type || '') = 'noop'
      AND status IN ('COMPLETED', 'CANCELLED') AND finished_at >= $1
    UNION ALL
    SELECT status FROM jobs WHERE (job_type || '') = 'noop'
      AND status = 'FAILED' AND finished_at >= $1
    UNION ALL
    SELECT status FROM jobs WHERE job_type = 'noop'
      AND status IN ('PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING') AND created_at >= $1
) AS x GROUP BY status
"""

INSERT_JOBS_WITH_OUTBOX = """
WITH j AS (
    INSERT INTO jobs (id, job_type, status, priority, payload)
    SELECT gen_random_uuid(), 'noop', 'PENDING', 5, '{}'::jsonb FROM generate_series(1, $1)
    RETURNING id, job_type, priority
)
INSERT INTO job_outbox (job_id, job_type, priority) SELECT id, job_type, priority FROM j
"""

# The table of a busy install, for the batch step at scale (10 million finished and pending
# jobs), rows $1..$2 of $3 (inserted in chunks): created over the six days before now,
# inside the default 7-day retention so the sweeper deletes none of them during the run; ids
# UUIDv7-shaped in creation order, as Conveyor's are, so inserts append to the primary key as
# production's do; 12 types (``(i + i / 100) % 12``, so every type gets every status), one of
# them the benchmark's own ``noop`` (the claim and the completion poll read past its history);
# 94 % COMPLETED, 2 % FAILED, 1 % CANCELLED and 3 % SCHEDULED over the next 30 days (waiting,
# none due during the run: the promoter stays idle).
# Each started job gets its attempt row, as the worker writes it.
INSERT_BACKFILL = """
WITH j AS (
  INSERT INTO jobs (id, job_type, status, priority, payload, result, attempts, last_error,
                    created_at, updated_at, started_at, finished_at, run_at)
  SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7'
          || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid,
         CASE WHEN (i + i / 100) % 12 = 0 THEN 'noop' ELSE 'type_' || ((i + i / 100) % 12) END,
         (CASE WHEN i % 100 < 94 THEN 'COMPLETED' WHEN i % 100 < 96 THEN 'FAILED'
               WHEN i % 100 = 96 THEN 'CANCELLED' ELSE 'SCHEDULED' END)::job_status,
         5, '{}'::jsonb, CASE WHEN i % 100 < 94 THEN 'null'::jsonb END,
         CASE WHEN i % 100 < 96 THEN 1 ELSE 0 END,
         CASE WHEN i % 100 IN (94, 95) THEN 'ValueError: ' || (i % 7) END,
         t, t + interval '5 ms',
         CASE WHEN i % 100 < 96 THEN t + interval '2 ms' END,
         CASE WHEN i % 100 < 97 THEN t + interval '5 ms' END,
         CASE WHEN i % 100 >= 97 THEN now() + make_interval(secs => 3600 + (i * 7919) % 2592000) END
  FROM generate_series($1::bigint, $2::bigint) AS i,
       LATERAL (SELECT now() - interval '6 days' + make_interval(secs => i * 518400.0 / $3))
         AS g(t)
  RETURNING id, job_type, status, started_at, finished_at, last_error
)
INSERT INTO job_attempts (job_id, attempt, job_type, worker_id, started_at, finished_at,
                          outcome, error, duration_seconds, wait_seconds)
SELECT id, 1, job_type, 'bench', started_at, finished_at,
       CASE WHEN status = 'FAILED' THEN 'failed' ELSE 'completed' END, last_error, 0.003, 0.002
FROM j WHERE started_at IS NOT NULL
"""
BACKFILL_CHUNK = 1_000_000

DRAIN_SECONDS = """
SELECT count(*) AS n, extract(epoch FROM max(finished_at) - min(started_at)) AS seconds
FROM jobs WHERE job_type = 'noop' AND status = 'COMPLETED' AND created_at >= $1
"""

LATENCY_MS = """
SELECT count(*) AS n,
       percentile_cont(0.50) WITHIN GROUP (ORDER BY s) * 1000 AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY s) * 1000 AS p99,
       max(s) * 1000 AS max,
       percentile_cont(0.50) WITHIN GROUP (ORDER BY e) * 1000 AS e2e_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY e) * 1000 AS e2e_p99
FROM (SELECT extract(epoch FROM started_at - created_at) AS s,
             extract(epoch FROM finished_at - created_at) AS e
      FROM jobs WHERE job_type = 'noop' AND status = 'COMPLETED' AND created_at >= $1) AS x
"""


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


async def recreate_database(url: str) -> None:
    """Drop the database of ``url`` (disconnecting whoever uses it) and create it empty."""
    name = urlsplit(url).path.lstrip("/")
    if not name or name in ("postgres", "template0", "template1"):
        raise ValueError(f"refusing to recreate database {name!r}")
    conn = await asyncpg.connect(with_database(url, "postgres"), timeout=10)
    try:
        quoted = '"' + name.replace('"', '""') + '"'
        await conn.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {quoted}")
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def noop_database(server_url: str, name: str) -> AsyncIterator[str]:
    """A database of the timing scripts' own on ``server_url``: migrated, with the job type
    ``noop`` registered; yields its URL and drops it afterwards."""
    from conveyor import JobRouter
    from conveyor.jobs.types import register_router_types
    from conveyor.store.migrate import upgrade

    url = with_database(server_url, name)
    await recreate_database(url)
    try:
        await asyncio.to_thread(upgrade, url)
        router = JobRouter()
        router.job("noop")(_noop)
        conn = await asyncpg.connect(url)
        await register_router_types(conn, router)
        await conn.close()
        yield url
    finally:
        admin = await asyncpg.connect(server_url)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def _noop(job: object) -> None:
    return None


class Db:
    """One connection for the harness's polls and measurements."""

    def __init__(self, conn: asyncpg.Connection, schema: str) -> None:
        self.conn = conn
        self.schema = schema

    @classmethod
    async def connect(cls, url: str) -> Db:
        """The harness's SQL names no schema: its connection's search_path starts with
        Conveyor's (``CONVEYOR_DB_SCHEMA``). Conveyor's own code never relies on that."""
        schema = os.environ.get("CONVEYOR_DB_SCHEMA", "conveyor")
        conn = await asyncpg.connect(
            url,
            timeout=10,
            server_settings={
                "application_name": "conveyor-bench",
                "search_path": f"{schema}, public",
            },
        )
        return cls(conn, schema)

    async def close(self) -> None:
        await self.conn.close()

    async def clock(self) -> Any:
        """PostgreSQL's current time (not the transaction's)."""
        return await self.conn.fetchval("SELECT clock_timestamp()")

    async def server_version(self) -> str:
        return str(await self.conn.fetchval("SHOW server_version"))

    async def completed_since(self, since: Any) -> int:
        return int(await self.conn.fetchval(COUNT_COMPLETED, since))

    async def statuses_since(self, since: Any) -> dict[str, int]:
        rows = await self.conn.fetch(COUNT_BY_STATUS, since)
        return {r["status"]: int(r["n"]) for r in rows}

    async def outbox_empty(self) -> bool:
        return not await self.conn.fetchval("SELECT EXISTS (SELECT 1 FROM job_outbox)")

    async def insert_with_outbox(self, n: int) -> None:
        """``n`` PENDING no-op jobs and their outbox rows in one transaction, which wakes the
        publisher at commit as ``conveyor.enqueue_many`` does (``pg_notify``)."""
        async with self.conn.transaction():
            await self.conn.execute(INSERT_JOBS_WITH_OUTBOX, n)
            await self.conn.execute("SELECT pg_notify($1, '')", f"{self.schema}_outbox")

    async def backfill(self, n: int, say: Any = None) -> None:
        """``n`` jobs of INSERT_BACKFILL in chunks (each its own transaction, so the WAL of one
        chunk is checkpointed while the next is written), then ``VACUUM ANALYZE`` as
        autovacuum would after a bulk load (statistics and the visibility map) and a
        ``CHECKPOINT`` (superuser, as the harness is)."""
        for first in range(1, n + 1, BACKFILL_CHUNK):
            last = min(n, first + BACKFILL_CHUNK - 1)
            await self.conn.execute(INSERT_BACKFILL, first, last, n, timeout=1800)
            if say is not None:
                say(f"   {last:,} of {n:,} rows")
        await self.conn.execute("VACUUM ANALYZE jobs, job_attempts", timeout=1800)
        # the load and the vacuum wrote ~5 GB of WAL: the checkpoints they started would go on
        # writing behind the first measured runs (a table that holds 10 million rows, not one
        # that was just written)
        await self.conn.execute("CHECKPOINT", timeout=1800)

    async def drain_rate(self, since: Any) -> tuple[int, float]:
        row = await self.conn.fetchrow(DRAIN_SECONDS, since)
        return int(row["n"]), float(row["seconds"] or 0.0)

    async def latency_ms(self, since: Any) -> dict[str, float]:
        row = await self.conn.fetchrow(LATENCY_MS, since)
        return {k: round(float(v), 2) for k, v in row.items() if v is not None}
