"""The workloads. Each returns a dict of measurements for ``latest.json`` and raises when it
cannot finish (a dead service, a failed submit, or the time limit)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import Harness

Result = dict[str, Any]


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else 0.0


class Countdown:
    """Waiting for ``count()`` to reach ``n``, paced: the next poll comes after a third of the
    time the rate so far says is left, between ``least`` and ``most`` seconds. The count reads
    every row finished in the run (several ms of PostgreSQL near the end of a run); polled every
    50 ms it takes a tenth of a core from the services measured (287 polls, 1.4 s of PostgreSQL
    in a 17 s REST run). The end is still seen within ``least`` of when the rate holds
    to within a factor of three."""

    def __init__(self, n: int, count: Any, *, least: float = 0.05, most: float = 0.25) -> None:
        self.n, self.count, self.least, self.most = n, count, least, most
        self.start = time.monotonic()
        self.seen = 0

    async def done(self) -> bool:
        self.seen = await self.count()
        return bool(self.seen >= self.n)

    def interval(self) -> float:
        elapsed = time.monotonic() - self.start
        if self.seen <= 0 or elapsed <= 0:
            return self.least
        left = (self.n - self.seen) / (self.seen / elapsed)
        return min(self.most, max(self.least, left / 3))


async def _since(db: Any, since: Any, before: int) -> int:
    return int(await db.completed_since(since)) - before


async def relay(h: Harness, n: int) -> tuple[Result, Any]:
    """``n`` job + outbox rows inserted in one transaction while no worker runs; the publisher's
    time from that commit to an empty outbox. Returns the result and the database time before
    the insert (the drain step measures those jobs)."""
    assert h.db is not None
    db = h.db
    # one job first: proves the publisher is relaying (and has declared the work queue)
    await db.insert_with_outbox(1)
    await h.poll(db.outbox_empty, what="the publisher relaying a first job", timeout=60)
    since = await db.clock()
    meter = h.cpu_meter()
    await db.insert_with_outbox(n)
    start = time.monotonic()
    end = await h.poll(db.outbox_empty, what=f"the publisher relaying {n} rows", interval=0.02)
    seconds = end - start
    return {
        "msgs": n,
        "seconds": round(seconds, 3),
        "msgs_per_s": _rate(n, seconds),
        "cpu_seconds": meter.stop(),
    }, since


async def drain(h: Harness, n: int, since: Any) -> Result:
    """Start the worker with ``n`` messages already queued; its rate from the first job started
    to the last one finished (both PostgreSQL timestamps, so worker start-up does not count).
    The CPU meter starts once the first job is done, so start-up is not in the CPU per job."""
    assert h.db is not None
    db = h.db
    h.start_conveyor(
        "worker", "worker", "--app", "bench.app:router", "--concurrency", str(h.opts.concurrency)
    )

    async def started() -> bool:
        return await db.completed_since(since) >= 1

    await h.poll(started, what="the worker finishing a first job", timeout=60, interval=0.01)
    meter = h.cpu_meter()
    done_before = await db.completed_since(since)

    countdown = Countdown(n - done_before, lambda: _since(db, since, done_before))
    await h.poll(countdown.done, what=f"the worker finishing {n} queued jobs",
                 interval=countdown.interval)  # fmt: skip
    cpu = meter.stop()
    count, seconds = await db.drain_rate(since)
    return {
        "jobs": count,
        "seconds": round(seconds, 3),
        "jobs_per_s": _rate(count, seconds),
        "cpu_seconds": cpu,
        "cpu_jobs": n - done_before,
    }


async def submitted(
    h: Harness, mode: str, n: int, *, procs: int, connections: int, rate: float = 0.0
) -> Result:
    """Submit ``n`` no-op jobs through the API with the load generators; time from the start
    signal to the poll that sees all ``n`` COMPLETED."""
    assert h.db is not None
    db = h.db
    await _quiet(h)
    gens = await h.loadgens(mode, n, procs=procs, connections=connections, rate=rate)
    finishing: asyncio.Task[list[Result]] | None = None
    try:
        meter = h.cpu_meter()
        since = await db.clock()
        start = time.monotonic()
        await gens.go()
        finishing = asyncio.create_task(gens.finish())

        async def completed() -> int:
            if finishing is not None and finishing.done():
                finishing.result()  # a failed load generator fails the workload now
            return await db.completed_since(since)

        countdown = Countdown(n, completed)
        end = await h.poll(countdown.done, what=f"{n} jobs submitted ({mode}) COMPLETED",
                           interval=countdown.interval)  # fmt: skip
        reports = await asyncio.wait_for(finishing, 60)
    finally:
        if finishing is not None and not finishing.done():
            finishing.cancel()
        gens.kill()
    seconds = end - start
    client_cpu = sum(r["cpu_seconds"] for r in reports)
    cpu = meter.stop(extra=[("loadgen", client_cpu)])  # before the harness's own count
    statuses = await db.statuses_since(since)
    return {
        "jobs": n,
        "seconds": round(seconds, 3),
        "jobs_per_s": _rate(n, seconds),
        "submit_seconds": max(r["seconds"] for r in reports),
        "submit_jobs_per_s": _rate(n, max(r["seconds"] for r in reports)),
        "client": {
            "processes": procs,
            "connections": connections,
            # above ~90 % of one core per process the load generator itself is the limit
            "cpu_pct_per_process": round(
                max(r["cpu_seconds"] / r["seconds"] for r in reports) * 100, 1
            ),
            "response_ms_p50": max(r["response_ms_p50"] or 0 for r in reports),
            "response_ms_p99": max(r["response_ms_p99"] or 0 for r in reports),
        },
        "statuses": statuses,
        "cpu_seconds": cpu,
        "since": since,
    }


async def latency(h: Harness, seconds: float, rate: float) -> Result:
    """``rate`` jobs/s for ``seconds`` (one per request, open loop); submit→start percentiles
    from the database: ``started_at - created_at``, both set by PostgreSQL's clock."""
    assert h.db is not None
    n = max(1, int(seconds * rate))
    result = await submitted(h, "paced", n, procs=1, connections=h.opts.connections, rate=rate)
    ms = await h.db.latency_ms(result.pop("since"))
    return {
        "jobs": n,
        "rate": rate,
        "p50": ms.get("p50"),
        "p99": ms.get("p99"),
        "max": ms.get("max"),
        "end_to_end_p50": ms.get("e2e_p50"),
        "end_to_end_p99": ms.get("e2e_p99"),
        "client": result["client"],
        "cpu_seconds": result["cpu_seconds"],
    }


async def backfill(h: Harness, rows: int, say: Callable[[str], None] | None = None) -> float:
    """Generate ``rows`` jobs of a busy install (``db.INSERT_BACKFILL``, in chunks) and VACUUM
    ANALYZE; returns the seconds it took. Its own time limit: ~a minute per million rows on a
    slow machine, at least ``--timeout``."""
    assert h.db is not None
    start = time.monotonic()
    await asyncio.wait_for(h.db.backfill(rows, say), max(h.opts.timeout, rows / 15_000))
    return round(time.monotonic() - start, 1)


async def table_size(h: Harness) -> dict[str, Any]:
    """Rows and on-disk size (with indexes) of ``jobs`` and ``job_attempts``."""
    assert h.db is not None
    row = await h.db.conn.fetchrow(
        "SELECT (SELECT count(*) FROM jobs) AS jobs,"
        " pg_total_relation_size('jobs') / 1048576 AS jobs_mb,"
        " (SELECT count(*) FROM job_attempts) AS attempts,"
        " pg_total_relation_size('job_attempts') / 1048576 AS attempts_mb"
    )
    return dict(row)


async def _quiet(h: Harness, timeout: float = 120.0) -> None:
    """Wait until the previous workload's jobs are all finished and the outbox is empty."""
    assert h.db is not None
    db = h.db

    async def idle() -> bool:
        busy = await db.conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM jobs"
            " WHERE job_type = 'noop' AND status IN ('PENDING', 'IN_PROGRESS'))"
        )
        return not busy and await db.outbox_empty()

    await h.poll(idle, what="the system going idle between workloads", timeout=timeout)
    # A server with autovacuum off (this project's development machines) never refreshes the
    # statistics of the run's new database: every plan is made for the empty tables the
    # migration left, and the services' cached plans are never invalidated. Between workloads
    # the harness does what autovacuum would have done by then (each workload changes far more
    # than the 1-2 % + 1,000 rows of its thresholds, migration 0009), so the figures are those
    # of a database that is looked after, as in production.
    if await db.conn.fetchval("SELECT current_setting('autovacuum') = 'off'"):
        tables = await db.conn.fetchval(
            "SELECT string_agg(quote_ident(c.relname), ', ') FROM pg_class c"
            " WHERE c.relname IN ('jobs', 'job_outbox', 'job_attempts') AND c.relkind = 'r'"
            " AND pg_table_is_visible(c.oid)"
        )
        await db.conn.execute(f"VACUUM ANALYZE {tables}", timeout=600)


# ---------------------------------------------------------------------------- Celery


def _celery_broker(amqp_url: str) -> str:
    return "py" + amqp_url if amqp_url.startswith("amqp") else amqp_url


# Celery's configurations the benchmark tries (each in turn, the best is compared): its pool
# argument, the worker's --concurrency, and how many processes that is.
CELERY_POOLS = {
    "solo": (["--pool=solo", "--concurrency=1"], 1),
    "prefork": (["--pool=prefork", "--concurrency=2"], 3),  # a consumer parent + 2 children
    "threads": (["--pool=threads", "--concurrency=4"], 1),
}


async def celery(h: Harness, n: int, repeat: int = 1, pool: str = "solo") -> Result:
    """Celery 5 on the same RabbitMQ, a worker in one of ``CELERY_POOLS``' configurations, tasks
    published by ``apply_async`` from a process of their own; each task run appends its finishing
    time to a counter file.

    First ``n`` tasks are published with no worker running (the publish rate), then the worker
    starts and drains them (from the first task's finish to the last's: the worker's own rate).
    Then, worker warm, ``n`` more (``repeat`` times, the best kept): first publish to the poll
    that sees the last task done, the number compared with Conveyor's batch workload."""
    from .celery_app import records, span  # Celery only here: bench.flow runs without it

    counter = h.logs / f"celery-{h.namespace}.count"
    counter.unlink(missing_ok=True)
    broker = _celery_broker(h.opts.amqp_url)
    prefetch = h.opts.concurrency  # the same window of unacknowledged messages as Conveyor's
    publish_argv = [
        sys.executable, "-m", "bench.celery_publish", "--broker", broker,
        "--queue", h.celery_queue, "--counter", str(counter), "--prefetch", str(prefetch),
        "--n", str(n),
    ]  # fmt: skip

    async def publish() -> Result:
        pub = await h.clients([publish_argv])
        try:
            await pub.go()
            return (await asyncio.wait_for(pub.finish(), h.opts.timeout))[0]
        finally:
            pub.kill()

    # 1. publish with no worker; the publisher declares the queue
    filled = await publish()
    # 2. the worker drains what is queued
    env = {
        **h.env,
        "BENCH_CELERY_BROKER": broker,
        "BENCH_CELERY_QUEUE": h.celery_queue,
        "BENCH_CELERY_COUNTER": str(counter),
        "BENCH_CELERY_PREFETCH": str(prefetch),
    }
    argv = [
        sys.executable, "-m", "celery", "-A", "bench.celery_worker", "worker",
        *CELERY_POOLS[pool][0], "-Q", h.celery_queue,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=WARNING", "-n", f"{h.namespace}@%h",
    ]  # fmt: skip
    h.rss.reset("celery")
    h.start("celery", argv, env)

    async def first() -> bool:
        return records(str(counter)) >= 1

    await h.poll(first, what="the Celery worker running a first task", timeout=60, interval=0.01)
    drain_meter = h.cpu_meter()
    done_before = records(str(counter))

    async def drained() -> bool:
        return records(str(counter)) >= n

    await h.poll(drained, what=f"the Celery worker draining {n} queued tasks")
    drain_cpu = drain_meter.stop()
    drain_seconds = span(str(counter), 0, n - 1)
    # 3. end to end, the worker running (``repeat`` times, the best reported)
    runs: list[Result] = []
    for i in range(repeat):
        runs.append(await _celery_e2e(h, publish_argv, counter, n, (i + 2) * n))
    best = max(runs, key=lambda r: float(r["jobs_per_s"]))
    h.stop("celery")
    rss = h.rss.peak_mb("celery")
    return {
        **best,
        **({"runs": [r["jobs_per_s"] for r in runs]} if repeat > 1 else {}),
        "publish_idle_worker_jobs_per_s": _rate(n, filled["seconds"]),
        "drain_seconds": round(drain_seconds, 3),
        "drain_jobs_per_s": _rate(n - 1, drain_seconds),
        "pool": pool,
        "worker_args": CELERY_POOLS[pool][0],
        "worker_processes": CELERY_POOLS[pool][1],
        "rss_mb": rss,
        "prefetch": prefetch,
        "drain_cpu_seconds": drain_cpu,
        "drain_cpu_jobs": n - done_before,
    }


async def _celery_e2e(
    h: Harness, publish_argv: list[str], counter: Path, n: int, total: int
) -> Result:
    """Publish ``n`` tasks; from the start signal to the poll that sees ``total`` records."""
    from .celery_app import records

    pub = await h.clients([publish_argv])
    finishing: asyncio.Task[list[Result]] | None = None
    try:
        meter = h.cpu_meter()
        start = time.monotonic()
        await pub.go()
        finishing = asyncio.create_task(pub.finish())

        async def done() -> bool:
            if finishing is not None and finishing.done():
                finishing.result()
            return records(str(counter)) >= total

        end = await h.poll(done, what=f"Celery running {n} tasks")
        reports = await asyncio.wait_for(finishing, 60)
    finally:
        if finishing is not None and not finishing.done():
            finishing.cancel()
        pub.kill()
    seconds = end - start
    return {
        "jobs": n,
        "seconds": round(seconds, 3),
        "jobs_per_s": _rate(n, seconds),
        "publish_seconds": reports[0]["seconds"],
        "publish_jobs_per_s": _rate(n, reports[0]["seconds"]),
        "cpu_seconds": meter.stop(extra=[("loadgen", reports[0]["cpu_seconds"])]),
    }
