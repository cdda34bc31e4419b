"""``python -m bench.flow_pass [--type flow_p4] [--keys 10000] [--per-key 2] [--explain]``: what
one admission pass (``admit`` in ``store/sql/schema/admission.sql``) costs at a number of keys,
without any service running, in a scratch database (``conveyor_bench_flow_pass``, dropped at the
end). The waiting jobs are inserted with ``enqueue_many`` and the statistics refreshed; each pass
runs in a transaction that is rolled back, so every pass sees the same jobs (median of
``--passes``). ``--started``: one job of each key started and finished just now, after the
statistics were taken (a rate window used; PostgreSQL then estimates the last window's starts
from a histogram that has none of them, as between two autovacuum analyses); ``--analyze``
refreshes them afterwards. ``--explain``: the plan of each statement of the last pass, with
its times and buffers (``auto_explain``, nested statements, sent to the client).

Example: ``--type flow_hourly --keys 10000 --per-key 11 --started`` against the same with
``--analyze`` (bench/README.md, "Admission")."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from conveyor import JobSpec, enqueue_many
from conveyor.jobs.types import register_router_types
from conveyor.store.migrate import upgrade

from . import flow_app
from .db import recreate_database, with_database

DATABASE = "conveyor_bench_flow_pass"
VACUUM = "VACUUM ANALYZE jobs, job_outbox, job_attempts, partitions, job_types"
STARTED = """
UPDATE jobs SET status = 'COMPLETED', attempts = 1, started_at = now(), finished_at = now()
WHERE id IN (SELECT DISTINCT ON (partition_key) id FROM jobs WHERE job_type = $1
             ORDER BY partition_key, id)
"""
EXPLAIN = [
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_buffers = on",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_level = notice",
    "SET client_min_messages = notice",
]


@contextlib.asynccontextmanager
async def scratch(server_url: str) -> AsyncIterator[asyncpg.Connection]:
    url = with_database(server_url, DATABASE)
    await recreate_database(url)
    try:
        await asyncio.to_thread(upgrade, url)
        schema = os.environ.get("CONVEYOR_DB_SCHEMA", "conveyor")
        conn = await asyncpg.connect(url, server_settings={"search_path": f"{schema}, public"})
        try:
            await register_router_types(conn, flow_app.router)
            yield conn
        finally:
            await conn.close()
    finally:
        admin = await asyncpg.connect(server_url)
        await admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        await admin.close()


async def passes(conn: asyncpg.Connection, a: argparse.Namespace) -> dict[str, Any]:
    times, admitted = [], 0
    notices: list[str] = []
    for i in range(a.passes):
        last = i == a.passes - 1
        tx = conn.transaction()
        await tx.start()
        try:
            if a.explain and last:
                for statement in EXPLAIN:
                    await conn.execute(statement)
                conn.add_log_listener(lambda _c, m: notices.append(m.message))
            t = time.perf_counter()
            admitted = await conn.fetchval("SELECT admit($1, $2)", a.type, a.window)
            times.append((time.perf_counter() - t) * 1000)
        finally:
            await tx.rollback()  # also undoes the SETs
    for text in notices:
        print(text, end="\n\n")
    return {"admitted": admitted, "ms": [round(t, 1) for t in times]}


async def main(a: argparse.Namespace) -> None:
    server = os.environ.get(
        "CONVEYOR_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    async with scratch(with_database(server, "postgres")) as conn:
        specs = [
            JobSpec(a.type, {}, partition_key=f"k{i}")
            for _ in range(a.per_key)
            for i in range(a.keys)
        ]
        async with conn.transaction():
            for i in range(0, len(specs), 5000):
                await enqueue_many(conn, specs[i : i + 5000])
        await conn.execute(VACUUM)
        if a.started:
            await conn.execute(STARTED, a.type)
        if a.analyze:
            await conn.execute(VACUUM)
        result = await passes(conn, a)
    print(
        f"{a.type}: {a.keys:,} keys x {a.per_key} waiting jobs"
        f"{', one started per key' if a.started else ''}"
        f"{', statistics refreshed' if a.analyze else ''}: a pass admitted {result['admitted']} "
        f"in {statistics.median(result['ms']):.0f} ms (median of {a.passes}: {result['ms']})"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.flow_pass", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--type", default="flow_p4", choices=sorted(flow_app.router.handlers))
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--per-key", type=int, default=2)
    p.add_argument("--window", type=int, default=200, help="admit's window (200)")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--started", action="store_true",
                   help="one job of each key started just now, after the statistics")  # fmt: skip
    p.add_argument("--analyze", action="store_true", help="refresh the statistics after that")
    p.add_argument("--explain", action="store_true", help="the last pass's nested plans")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
