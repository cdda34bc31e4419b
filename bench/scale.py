"""``python -m bench.scale [--rows 10000000]`` (``make bench-scale``): Conveyor's database side
with millions of jobs. In databases of its own (``conveyor_scale_bench`` and ``…_empty``, dropped
at the end unless ``--keep``; ``--reuse`` starts from a kept one that still has the rows):

1. on the empty table: each maintenance duty's idle pass;
2. ``--rows`` jobs generated in SQL (``tests/integration/plans.py``: 30 days, 94 % COMPLETED,
   2 % FAILED, 1 % each SCHEDULED / PENDING / RETRYING / IN_PROGRESS; a fifth of them in
   workflows, fan-ins with their rows and edges), their attempts, ``VACUUM ANALYZE`` (indexes
   built after the rows, like a restore);
3. on the full table: EXPLAIN of every statement, view and workflow trigger path (no
   sequential scan), each duty's idle pass (median of 7; target ≤ 50 ms), the jobs gauges
   against exact counts (which pairs are estimated, how far off);
4. the store's batch rate (insert 500 jobs with their outbox rows → take the outbox batch →
   claim → complete, as the API, relay and worker do, straight through the store), empty and
   full in ``--rounds`` ABBA pairs of ``--seconds`` each: medians and the median of the pairs'
   ratios (target ≥ 90 %);
5. retention of the older half (``retention_days`` moved to 15: ~4.7 million rows at 10
   million) beside the batch workload, in windows of ``--retention-seconds`` with retention on
   and paused in turn, until it is done or ``--retention-limit`` seconds: rows deleted per
   second and the median ratio of the pairs of windows (target ≥ 80 %).
6. ``GET /types/{type}/partitions``' statement at 10,000 keys of 10 waiting jobs each
   (``--partition-keys``; 0: skip), beside the full table and on the empty one: the first page
   of 100 and one from the middle of the walk (median of 7; target ≤ 200 ms), and its plan (no
   sequential scan of ``jobs`` beside the full table); the keys' jobs are deleted after.

Every run records the load average beside it: the figures are only as quiet as the machine.
Prints a markdown table and writes ``bench/results/scale.json``. Kept out of ``make test`` and
``make bench``: generating 10 million rows takes minutes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from conveyor.core.config import Settings
from conveyor.core.jobs import new_job_id
from conveyor.core.limits import Partitioning
from conveyor.core.metrics import Metrics
from conveyor.maintenance.gauges import EXACT_UP_TO, Gauges
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import Completion, JobTypeDefaults, NewJob, for_schema
from conveyor.store.connect import create_pool, with_database
from conveyor.store.migrate import upgrade
from conveyor.store.registry import bind
from tests.integration.plans import (
    OUTBOX,
    explain_all,
    explain_triggers,
    generate,
    partition_keys_sql,
    scans,
)

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
        "gauges: capped counts": lambda: _none(
            lambda c: store.job_counts_capped(c, EXACT_UP_TO), sweeper.pool
        ),
        "backlog view (dashboard)": lambda: _none(store.job_backlog, sweeper.pool),
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


PARTITIONED = "bench_partitioned"


async def _partition_list(url: str, keys: int, repeat: int = 7) -> dict[str, Any]:
    """The partitions list (``partition_page``, as ``GET /types/{type}/partitions`` runs it) at
    ``keys`` keys of 10 waiting jobs each: the first page of 100 and a page from the middle of
    the walk, median of ``repeat`` in milliseconds (jit off, as Conveyor's pools), and the
    scans of ``jobs`` in the plan. The keys' jobs are deleted afterwards."""
    conn = await asyncpg.connect(
        url, server_settings={"search_path": "conveyor, public", "jit": "off"}
    )
    try:
        kind = JobTypeDefaults(PARTITIONED, partition=Partitioning(("acct",), 2))
        await store.job_type_register_many(conn, [kind])
        for sql in partition_keys_sql(PARTITIONED, keys):
            await conn.execute(sql, timeout=600)
        await conn.execute("VACUUM ANALYZE jobs", timeout=7200)  # as autovacuum would by then
        first = await store.partition_page(conn, PARTITIONED, after=None, limit=keys // 2)
        middle = (first[-1].since, first[-1].key)
        out: dict[str, Any] = {"keys": keys, "waiting": keys * 10}
        for name, after in (("first_page_ms", None), ("middle_page_ms", middle)):
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                page = await store.partition_page(conn, PARTITIONED, after=after, limit=101)
                times.append((time.perf_counter() - t) * 1000)
                assert len(page) == 101, len(page)
            out[name] = round(statistics.median(times), 1)
        values = {"job_type": PARTITIONED, "after_since": middle[0], "after_key": middle[1],
                  "limit": 101}  # fmt: skip
        plan = await conn.fetchval(
            f"EXPLAIN (FORMAT JSON) {store.sql['partition_page']}",
            *bind("partition_page", values),
        )
        out["jobs_scans"] = sorted({f"{n} {i}".strip() for n, r, i in scans(json.loads(plan))
                                    if r == "jobs"})  # fmt: skip
    finally:
        await conn.execute("DELETE FROM jobs WHERE job_type = $1", PARTITIONED, timeout=600)
        await conn.execute("DELETE FROM partitions WHERE job_type = $1", PARTITIONED)
        await conn.execute("DELETE FROM job_types WHERE name = $1", PARTITIONED)
        # the next steps find the table as before: the deleted rows' space reusable, fresh
        # statistics (the pages this step touched only: the rest stays all-visible)
        await conn.execute("VACUUM ANALYZE jobs", timeout=7200)
        await conn.close()
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
                await store.job_insert(conn, jobs)
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
        await generate(conn, rows, workflow_every=5)
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
        _, bad_triggers = await explain_triggers(conn)
    finally:
        await conn.close()
    return bad + bad_triggers


async def _retention_under_load(
    settings: Settings, seconds: float, limit: float, vacuum: bool
) -> dict[str, Any]:
    """Retention of the older half (~4.7 million COMPLETED jobs past 15 days) with the batch
    workload running all along, in windows of ``seconds``: retention on, then paused, in turn,
    until it has deleted everything or ``limit`` seconds have passed. Each pair of windows gives
    a ratio (workload beside retention / workload alone right after); the median of those is
    the figure, and the autovacuum the deletions trigger runs in both kinds of window
    (``vacuum``: a server without autovacuum gets ``_vacuum_like_autovacuum`` throughout)."""
    sweeper = Sweeper(settings.model_copy(update={"retention_days": 15.0}))
    await sweeper.start()
    vacuum_stop = asyncio.Event()
    vacuums = asyncio.create_task(
        _vacuum_like_autovacuum(settings.database_url, vacuum_stop) if vacuum else _zero()
    )
    deleted = 0
    deleting = 0.0
    on: list[float] = []
    off: list[float] = []
    load: list[float] = []
    finished = False
    t0 = time.perf_counter()
    try:
        while not finished and time.perf_counter() - t0 < limit:
            stop = asyncio.Event()

            async def retention(stop: asyncio.Event = stop) -> None:
                nonlocal deleted, finished
                while not stop.is_set():
                    async with sweeper.pool.acquire() as conn, conn.transaction():
                        n = await store.job_delete_expired(
                            conn, older_than=15 * 86400, failed_older_than=30 * 86400,
                            limit=settings.retention_batch,
                        )  # fmt: skip
                    deleted += n
                    if n < settings.retention_batch:
                        finished = True
                        return
                    await asyncio.sleep(settings.retention_pause)

            load.append(_load())
            task = asyncio.create_task(retention())
            t = time.perf_counter()
            try:
                on.append(await _batch_rate(settings.database_url, seconds, stop=_done(task)))
            finally:
                stop.set()
                await task
                deleting += time.perf_counter() - t
            off.append(await _batch_rate(settings.database_url, seconds))
            _say(f"  deleted {deleted:,}: {on[-1]} beside retention, {off[-1]} alone jobs/s")
    finally:
        vacuum_stop.set()
        await sweeper.close()
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return {
        "vacuums_of_jobs": await vacuums,
        "deleted": deleted,
        "finished": finished,
        "deleted_per_s": round(deleted / deleting),
        "deleting_s": round(deleting),
        "beside_runs": on,
        "alone_runs": off,
        "load_average": load,
        "beside_median": statistics.median(on),
        "alone_median": statistics.median(off),
        "median_pair_ratio": round(statistics.median(ratios), 3),
        "pair_ratios": [round(r, 3) for r in ratios],
    }


async def _zero() -> int:
    return 0


def _done(task: asyncio.Task[None]) -> asyncio.Event:
    """An event set when ``task`` ends (the last window stops when retention has finished)."""
    ev = asyncio.Event()
    task.add_done_callback(lambda _: ev.set())
    return ev


async def _fresh(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    await _admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await _admin(url, f'CREATE DATABASE "{name}"')
    await asyncio.to_thread(upgrade, url)


async def _vacuum(url: str) -> None:
    """What autovacuum would have done by now (``jobs``: after 1 % dead rows, migration 0009),
    for a server that runs with ``autovacuum = off`` (the shared test server does): without it
    every batch leaves two dead versions per job and the comparison measures the garbage."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM conveyor.jobs, conveyor.job_outbox", timeout=3600)
    finally:
        await conn.close()


async def _autovacuum_off(url: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SHOW autovacuum") == "off")
    finally:
        await conn.close()


async def _vacuum_like_autovacuum(url: str, stop: asyncio.Event) -> int:
    """With ``autovacuum = off``: a VACUUM of ``jobs`` each time its dead rows pass 1 % (+1,000),
    throttled like an autovacuum worker (cost limit 2,000, delay 2 ms), until ``stop``.
    Returns how many vacuums ran."""
    conn = await asyncpg.connect(url)
    runs = 0
    try:
        await conn.execute("SET vacuum_cost_limit = 2000; SET vacuum_cost_delay = '2ms'")
        while not stop.is_set():
            dead, live = await conn.fetchrow(
                "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables"
                " WHERE relid = 'conveyor.jobs'::regclass"
            )
            if dead > 0.01 * live + 1000:
                await conn.execute("VACUUM conveyor.jobs, conveyor.job_outbox", timeout=3600)
                runs += 1
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 5)
    finally:
        await conn.close()
    return runs


def _load() -> float:
    return round(os.getloadavg()[0], 1)


async def _rates(
    empty: str, full: str, seconds: float, rounds: int, vacuum: bool
) -> dict[str, Any]:
    """``rounds`` pairs of runs, empty and full in ABBA order (empty-full, full-empty, ...), so
    a neighbour's burst or a drift over the minutes lands on both sides alike. Reported: the
    median of each side and the median of the pairs' ratios (each pair ran back to back), with
    every run and the load average beside it: on a shared machine one run proves nothing.
    ``vacuum``: VACUUM the table before each run (a server without autovacuum)."""
    e: list[float] = []
    f: list[float] = []
    load: list[float] = []
    for i in range(rounds):
        order = ((e, empty), (f, full)) if i % 2 == 0 else ((f, full), (e, empty))
        for runs, url in order:
            if vacuum:
                await _vacuum(url)
            load.append(_load())
            runs.append(await _batch_rate(url, seconds))
        _say(f"  pair {i + 1}/{rounds}: empty {e[-1]}, full {f[-1]} jobs/s (load {load[-1]})")
    ratios = [b / a for a, b in zip(e, f, strict=True)]
    return {
        "empty_runs": e,
        "full_runs": f,
        "load_average": load,
        "empty_median": statistics.median(e),
        "full_median": statistics.median(f),
        "median_pair_ratio": round(statistics.median(ratios), 3),
        "pair_ratios": [round(r, 3) for r in ratios],
    }


async def _reusable(url: str, rows: int) -> bool:
    """A database kept by ``--keep`` whose older half is still there (retention not run): its
    COMPLETED jobs past 15 days, counted (``reltuples`` after a partial vacuum is no measure)."""
    try:
        conn = await asyncpg.connect(url)
    except asyncpg.InvalidCatalogNameError:
        return False
    try:
        if not await conn.fetchval("SELECT to_regclass('conveyor.jobs') IS NOT NULL"):
            return False
        old = await conn.fetchval(
            "SELECT count(*) FROM conveyor.jobs WHERE status = 'COMPLETED'"
            " AND finished_at < now() - interval '15 days'",
            timeout=600,
        )
    finally:
        await conn.close()
    return bool(old >= rows * 0.45)


async def _reuse(url: str) -> dict[str, float]:
    """Migrate a kept database to head, give it back its outbox backlog, vacuum and analyze."""
    await asyncio.to_thread(upgrade, url)
    conn = await asyncpg.connect(url, server_settings={"search_path": "conveyor, public"})
    try:
        await conn.execute("DELETE FROM job_outbox")
        await conn.execute(OUTBOX)
        t = time.perf_counter()
        await conn.execute("VACUUM ANALYZE jobs", timeout=7200)
        await conn.execute("VACUUM ANALYZE job_outbox", timeout=7200)
        return {"reused": 1, "vacuum_s": round(time.perf_counter() - t, 1)}
    finally:
        await conn.close()


async def _gauge_accuracy(settings: Settings) -> dict[str, Any]:
    """The jobs gauges after one refresh against exact counts: how many pairs are estimated and
    how far the estimates are from the truth."""
    sweeper = Sweeper(settings)
    await sweeper.start()
    metrics = Metrics()
    try:
        await Gauges(metrics, store, sweeper.pool, sweeper.topology).refresh_once()
        async with sweeper.pool.acquire() as conn:
            truth = await conn.fetch(
                "SELECT job_type, status::text AS status, count(*) AS n FROM conveyor.jobs"
                " WHERE status NOT IN ('COMPLETED', 'CANCELLED') GROUP BY 1, 2"
            )
    finally:
        await sweeper.close()
    errors = []
    exact = 0
    for r in truth:
        labels = {"type": r["job_type"], "status": r["status"]}
        got = metrics.registry.get_sample_value("conveyor_jobs", labels)
        if metrics.registry.get_sample_value("conveyor_jobs_estimated", labels):
            errors.append(round((got or 0) / r["n"] - 1, 3))
        else:
            exact += got == r["n"]
    return {"pairs": len(truth), "exact": exact, "estimated": len(errors),
            "estimate_errors": sorted(errors)}  # fmt: skip


async def main(opts: argparse.Namespace) -> dict[str, Any]:
    url = with_database(opts.database_url, DATABASE)
    empty = with_database(opts.database_url, DATABASE + "_empty")
    reuse = opts.reuse and await _reusable(url, opts.rows)
    if not reuse:
        await _fresh(url)
    await _fresh(empty)
    settings = Settings(
        database_url=url, retention_days=60, failed_retention_days=60, reconcile_after=86400
    )
    out: dict[str, Any] = {"rows": opts.rows, "cpus": os.cpu_count()}
    try:
        _say("empty table: idle passes ...")
        out["empty_idle_ms"] = await _idle_passes(
            settings.model_copy(update={"database_url": empty})
        )
        if reuse:
            _say(f"reusing the kept {opts.rows:,} jobs ...")
            out.update(await _reuse(url))
        else:
            _say(f"generating {opts.rows:,} jobs ...")
            out.update(await _generate(url, opts.rows))
        _say("full table: plans, idle passes ...")
        out["sequential_scans"] = await _plans(url)
        # with the outbox of the 100,000 PENDING jobs waiting (a relay that fell behind) ...
        out["full_outbox_backlog_idle_ms"] = await _idle_passes(settings)
        await _admin_sql(url, "DELETE FROM conveyor.job_outbox")
        vacuum = out["autovacuum_off"] = await _autovacuum_off(url)
        if vacuum:
            await _vacuum(url)
        # ... and published (a relay that keeps up)
        out["full_idle_ms"] = await _idle_passes(settings)
        out["gauge_accuracy"] = await _gauge_accuracy(settings)
        if opts.partition_keys > 0:
            _say(f"the partitions list at {opts.partition_keys:,} keys ...")
            out["partitions"] = {
                "empty": await _partition_list(empty, opts.partition_keys),
                "full": await _partition_list(url, opts.partition_keys),
            }
        if opts.rounds > 0:
            _say("batch rate, empty and full in turn ...")
            out["batch"] = await _rates(empty, url, opts.seconds, opts.rounds, vacuum)
        if opts.retention_limit > 0:
            _say("retention of the older half beside the batch workload ...")
            out["retention"] = await _retention_under_load(
                settings, opts.retention_seconds, opts.retention_limit, vacuum
            )
    finally:
        for u in (url, empty) if not opts.keep else (empty,):
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
    b = r.get("batch")
    if b:
        lines.append(
            f"| store batch rate (jobs/s), median of {len(b['full_runs'])} ABBA pairs | "
            f"{b['empty_median']} | {b['full_median']} (pairs' median ratio "
            f"{b['median_pair_ratio']:.0%}, range {min(b['pair_ratios']):.0%} to "
            f"{max(b['pair_ratios']):.0%}) | ≥ 90 % |"
        )
    ret = r.get("retention")
    if ret:
        lines.append(
            f"| … while retention deletes {ret['deleted']:,} rows ({ret['deleted_per_s']:,}/s"
            f"{', all' if ret['finished'] else ', stopped at the limit'}) | | "
            f"{ret['beside_median']} vs {ret['alone_median']} alone (pairs' median ratio "
            f"{ret['median_pair_ratio']:.0%}, range {min(ret['pair_ratios']):.0%} to "
            f"{max(ret['pair_ratios']):.0%}) | ≥ 80 % |"
        )
    g = r["gauge_accuracy"]
    lines.append(
        f"| jobs gauges: exact / estimated pairs (estimate errors) | | {g['exact']} / "
        f"{g['estimated']} ({g['estimate_errors']}) | |"
    )
    parts = r.get("partitions")
    if parts:
        e, f = parts["empty"], parts["full"]
        lines.append(
            f"| partitions list, {f['keys']:,} keys x 10 waiting: a page of 100, first / middle "
            f"(ms) | {e['first_page_ms']} / {e['middle_page_ms']} | {f['first_page_ms']} / "
            f"{f['middle_page_ms']} ({', '.join(f['jobs_scans'])}) | ≤ 200 |"
        )
    lines.append(f"| sequential scans in plans | | {len(r['sequential_scans'])} | 0 |")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--seconds", type=float, default=10.0, help="per batch-rate measurement")
    p.add_argument("--rounds", type=int, default=8, help="empty/full pairs (0: skip the step)")
    p.add_argument("--retention-seconds", type=float, default=20.0, help="per window")
    p.add_argument("--retention-limit", type=float, default=2400.0,
                   help="stop retention after this many seconds (0: skip the step)")  # fmt: skip
    p.add_argument("--partition-keys", type=int, default=10_000,
                   help="keys (10 waiting jobs each) for the partitions list; 0: skip")  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--reuse", action="store_true",
                   help="use a database --keep left if it still has --rows jobs")  # fmt: skip
    p.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--out", default=str(RESULTS), help="where to write the JSON")
    opts = p.parse_args()
    result = asyncio.run(main(opts))
    out = Path(opts.out)
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
