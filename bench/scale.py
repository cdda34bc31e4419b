"""``python -m bench.scale [--rows 10000000]`` (``make bench-scale``): Conveyor's database side
with millions of jobs. In a database of its own (``conveyor_scale_bench``, dropped at the end):

1. on the empty table: each maintenance duty's idle pass and the store's batch rate (insert 500
   jobs with their outbox rows → take the outbox batch → claim → complete, as the API, relay
   and worker do, straight through the store);
2. ``--rows`` jobs generated in SQL (``tests/integration/plans.py``: 30 days, 94 % COMPLETED,
   2 % FAILED, 1 % each SCHEDULED / PENDING / RETRYING / IN_PROGRESS), their attempts,
   ``VACUUM ANALYZE`` (indexes built after the rows, like a restore);
3. again: each duty's idle pass (median of 7; target ≤ 50 ms), the batch rate (target ≥ 90 %
   of empty), EXPLAIN of every statement (no sequential scan);
4. retention of the older half (``retention_days`` moved to 15) running beside the batch
   workload for ``--retention-seconds``: rows deleted per second, and the batch rate meanwhile
   (target ≥ 80 % of normal).

Prints a markdown table and writes ``bench/results/scale.json``. Kept out of ``make test`` and
``make bench``: generating 10 million rows takes minutes."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from conveyor.core.config import Settings
from conveyor.core.jobs import new_job_id
from conveyor.core.metrics import Metrics
from conveyor.maintenance.gauges import Gauges
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import Completion, NewJob, for_schema
from conveyor.store.connect import create_pool, with_database
from conveyor.store.migrate import upgrade
from tests.integration.plans import explain_all, generate

DATABASE = "conveyor_scale_bench"
RESULTS = Path(__file__).parent / "results" / "scale.json"
BATCH = 500
store = for_schema()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _idle_passes(settings: Settings, repeat: int = 7) -> dict[str, float]:
    """Milliseconds of each duty's idle pass (median of ``repeat``)."""
    sweeper = Sweeper(settings)
    await sweeper.start()

    async def no_depth(_: str) -> int:
        return 0

    gauges = Gauges(Metrics(), store, sweeper.pool, sweeper.topology)
    duties: dict[str, Any] = {
        "promote_due": sweeper.promote_due,
        "recover_leases": sweeper.recover_leases,
        "reconcile": lambda: sweeper.reconcile(queue_depth=no_depth),
        "retention": sweeper.delete_expired,
        "gauges": gauges.refresh_once,
        "gauges: backlog view": lambda: _none(store.job_backlog, sweeper.pool),
        "gauges: outbox count": lambda: _none(store.outbox_stats, sweeper.pool),
    }
    out: dict[str, float] = {}
    try:
        for name, duty in duties.items():
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                done = await duty()
                times.append((time.perf_counter() - t) * 1000)
                assert not done, f"{name} was not idle: {done}"
            out[name] = round(statistics.median(times), 2)
    finally:
        await sweeper.close()
    return out


async def _none(statement: Any, pool: Any) -> None:
    async with pool.acquire() as conn:
        await statement(conn)


async def _batch_rate(url: str, seconds: float, stop: asyncio.Event | None = None) -> float:
    """Jobs per second through insert → outbox take → claim → complete, 500 at a time, two
    connections in turn (API/relay, worker)."""
    pool = await create_pool(url, application_name="bench-scale", max_size=2)
    done = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds and not (stop and stop.is_set()):
            jobs = [NewJob(new_job_id(), "bench_noop", "{}", 5) for _ in range(BATCH)]
            async with pool.acquire() as conn:
                await store.job_insert_many(conn, jobs)
                async with conn.transaction():
                    rows = await store.outbox_take_batch(conn, limit=BATCH)
            async with pool.acquire() as conn:
                claimed = await store.job_claim_many(
                    conn, [r.job_id for r in rows], lease_seconds=30, worker_id="bench",
                    types=["bench_noop"], handler_defaults={}, default_max_retries=3,
                )  # fmt: skip
                await store.job_complete_many(
                    conn, [Completion(c.id, c.attempts, "null") for c in claimed]
                )
            done += len(claimed)
    finally:
        await pool.close()
    return round(done / (time.perf_counter() - t0), 1)


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(with_database(url, "postgres"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _admin_sql(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _generate(url: str, rows: int) -> dict[str, float]:
    conn = await asyncpg.connect(url, server_settings={"search_path": "conveyor, public"})
    took: dict[str, float] = {}
    try:
        t = time.perf_counter()
        await generate(conn, rows)
        took["generate_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        await conn.execute("VACUUM ANALYZE jobs", timeout=7200)
        await conn.execute("VACUUM ANALYZE job_attempts", timeout=7200)
        took["vacuum_s"] = round(time.perf_counter() - t, 1)
        took["table_mb"] = round(
            await conn.fetchval("SELECT pg_total_relation_size('jobs')") / 2**20, 1
        )
    finally:
        await conn.close()
    return took


async def _plans(url: str) -> list[str]:
    conn = await asyncpg.connect(url, server_settings={"search_path": "conveyor, public"})
    try:
        _, bad = await explain_all(conn)
    finally:
        await conn.close()
    return bad


async def _retention_under_load(
    settings: Settings, seconds: float, rounds: int
) -> dict[str, float]:
    """Retention of the older half beside the batch workload, in turn with the workload alone
    (best of ``rounds`` each)."""
    sweeper = Sweeper(settings.model_copy(update={"retention_days": 15.0}))
    await sweeper.start()
    deleted = 0
    busy = 0.0
    alone: list[float] = []
    beside: list[float] = []
    try:
        for _ in range(rounds):
            alone.append(await _batch_rate(settings.database_url, seconds))
            stop = asyncio.Event()

            async def retention(stop: asyncio.Event = stop) -> None:
                nonlocal deleted
                while not stop.is_set():
                    async with sweeper.pool.acquire() as conn, conn.transaction():
                        n = await store.job_delete_expired(
                            conn, older_than=15 * 86400, failed_older_than=30 * 86400,
                            limit=settings.retention_batch,
                        )  # fmt: skip
                    deleted += n
                    await asyncio.sleep(settings.retention_pause)

            task = asyncio.create_task(retention())
            t = time.perf_counter()
            try:
                beside.append(await _batch_rate(settings.database_url, seconds))
            finally:
                stop.set()
                await task
                busy += time.perf_counter() - t
    finally:
        await sweeper.close()
    return {
        "batch_alone_jobs_per_s": max(alone),
        "batch_jobs_per_s": max(beside),
        "deleted": deleted,
        "deleted_per_s": round(deleted / busy),
    }


async def _fresh(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    await _admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await _admin(url, f'CREATE DATABASE "{name}"')
    await asyncio.to_thread(upgrade, url)


async def _rates(empty: str, full: str, seconds: float, rounds: int) -> tuple[float, float]:
    """Best of ``rounds`` each, alternating empty and full: on a shared machine the best run is
    the least disturbed one, and alternating spreads the disturbance over both."""
    e: list[float] = []
    f: list[float] = []
    for _ in range(rounds):
        e.append(await _batch_rate(empty, seconds))
        f.append(await _batch_rate(full, seconds))
    return max(e), max(f)


async def main(opts: argparse.Namespace) -> dict[str, Any]:
    url = with_database(opts.database_url, DATABASE)
    empty = with_database(opts.database_url, DATABASE + "_empty")
    await _fresh(url)
    await _fresh(empty)
    settings = Settings(
        database_url=url, retention_days=60, failed_retention_days=60, reconcile_after=86400
    )
    out: dict[str, Any] = {"rows": opts.rows}
    try:
        _say("empty table: idle passes ...")
        out["empty_idle_ms"] = await _idle_passes(settings)
        _say(f"generating {opts.rows:,} jobs ...")
        out.update(await _generate(url, opts.rows))
        _say("full table: plans, idle passes ...")
        out["sequential_scans"] = await _plans(url)
        # with the outbox of the 100,000 PENDING jobs waiting (a relay that fell behind) ...
        out["full_outbox_backlog_idle_ms"] = await _idle_passes(settings)
        await _admin_sql(url, "DELETE FROM conveyor.job_outbox")
        # ... and published (a relay that keeps up)
        out["full_idle_ms"] = await _idle_passes(settings)
        _say("batch rate, empty and full in turn ...")
        e, f = await _rates(empty, url, opts.seconds, opts.rounds)
        out["empty_batch_jobs_per_s"], out["full_batch_jobs_per_s"] = e, f
        _say("retention of the older half beside the batch workload ...")
        out["retention"] = await _retention_under_load(
            settings, opts.retention_seconds, opts.rounds
        )
    finally:
        if not opts.keep:
            for u in (url, empty):
                name = u.rsplit("/", 1)[1]
                await _admin(u, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return out


def report(r: dict[str, Any]) -> str:
    lines = [f"| with {r['rows']:,} jobs | empty | full | target |", "|---|---|---|---|"]
    backlog = r["full_outbox_backlog_idle_ms"]
    for duty, ms in r["full_idle_ms"].items():
        lines.append(
            f"| {duty}: idle pass (ms) | {r['empty_idle_ms'][duty]} | {ms} "
            f"({backlog[duty]} with a 100k-row outbox) | ≤ 50 |"
        )
    e, f = r["empty_batch_jobs_per_s"], r["full_batch_jobs_per_s"]
    lines.append(f"| store batch rate (jobs/s) | {e} | {f} ({f / e:.0%}) | ≥ 90 % |")
    ret = r["retention"]
    lines.append(
        f"| … while retention deletes {ret['deleted_per_s']:,} rows/s | | "
        f"{ret['batch_jobs_per_s']} ({ret['batch_jobs_per_s'] / ret['batch_alone_jobs_per_s']:.0%}"
        f" of {ret['batch_alone_jobs_per_s']}) | ≥ 80 % |"
    )
    lines.append(f"| sequential scans in plans | | {len(r['sequential_scans'])} | 0 |")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--seconds", type=float, default=15.0, help="per batch-rate measurement")
    p.add_argument("--rounds", type=int, default=3, help="batch-rate runs per table (best)")
    p.add_argument("--retention-seconds", type=float, default=15.0)
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    result = asyncio.run(main(p.parse_args()))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
