"""``python -m bench.limited_claim [--limits 100,2000,10000] [--claims 50]``: the cost of the
limited claim (``job_claim_controlled``) at a *full* type, by its concurrency limit.

For each limit N, in a database of its own (dropped at the end): a type limited to N, N of its
jobs claimed through the same statement (so the type row carries N recorded claims and N jobs
are IN_PROGRESS, as a full type of a busy fleet), then ``--claims`` claims of one delivered job
each, which the full type holds in the claimer's hand (the path of every delivery and of every
retry of a hand while the type is full). Prints the median and p90 per claim, with the load
average beside it: the figures are only as quiet as the machine. The claim counts the type's
running jobs, so its cost grows with the limit; ``core.limits.MAX_CONCURRENCY`` caps it."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid

import asyncpg

from conveyor import JobRouter, JobSpec, enqueue_many
from conveyor.jobs.types import register_router_types
from conveyor.store import for_schema
from conveyor.store.connect import ensure_database, with_database
from conveyor.store.migrate import upgrade

store = for_schema()
BATCH = 500


async def _noop(job: object) -> None:
    return None


async def _claim(
    conn: asyncpg.Connection, ids: list[uuid.UUID], name: str, room: int
) -> tuple[int, int]:
    claimed, held = await store.job_claim_controlled(
        conn, ids, lease_seconds=3600.0, worker_id="bench", types=[name],
        handler_defaults={}, default_max_retries=3, room={name: room},
    )  # fmt: skip
    return len(claimed), len(held)


async def one_limit(server: str, limit: int, claims: int) -> dict[str, float]:
    name = f"conveyor_claim_bench_{os.getpid()}_{limit}"
    url = with_database(server, name)
    await ensure_database(url)
    await asyncio.to_thread(upgrade, url)
    conn = await asyncpg.connect(url, server_settings={"search_path": "conveyor"})
    try:
        r = JobRouter()
        r.job("lim", concurrency=limit)(_noop)  # type: ignore[arg-type]
        await register_router_types(conn, r)
        running = await enqueue_many(conn, [JobSpec("lim") for _ in range(limit)])
        waiting = await enqueue_many(conn, [JobSpec("lim") for _ in range(claims)])
        await conn.execute("DELETE FROM job_outbox")
        for i in range(0, limit, BATCH):  # fill the type through the claim itself
            got, _ = await _claim(conn, running[i : i + BATCH], "lim", 0)
            assert got == len(running[i : i + BATCH]), (limit, i, got)
        await conn.execute("ANALYZE jobs; ANALYZE job_types")
        times = []
        for job_id in waiting:
            t0 = time.perf_counter()
            got, held = await _claim(conn, [job_id], "lim", 4)
            times.append(time.perf_counter() - t0)
            assert (got, held) == (0, 1)  # full: held in hand
        times.sort()
        return {
            "p50_ms": statistics.median(times) * 1000,
            "p90_ms": times[int(len(times) * 0.9)] * 1000,
        }
    finally:
        await conn.close()
        admin = await asyncpg.connect(with_database(server, "postgres"))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limits", default="100,2000,10000")
    p.add_argument("--claims", type=int, default=50)
    args = p.parse_args()
    server = os.environ.get(
        "CONVEYOR_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    print("| concurrency limit (full) | p50 per claim | p90 | load average |")
    print("|---|---|---|---|")
    for limit in (int(x) for x in args.limits.split(",")):
        got = await one_limit(server, limit, args.claims)
        load = os.getloadavg()[0]
        print(f"| {limit:,} | {got['p50_ms']:.1f} ms | {got['p90_ms']:.1f} ms | {load:.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
