"""``python -m bench.flow [--scenario NAME] [--scale F]`` (``make bench-flow``): admission
(``store/sql/schema/admission.sql``, ``maintenance/admission.py``) on real processes, each figure
a ratio or a bound measured within the run (never an absolute rate against a fixed number: the
machine is shared). bench/README.md, "Admission", says what each figure means.

What runs: ``conveyor api``, ``conveyor publisher`` (the relay and the sweeper, whose admission
duty admits the waiting jobs) and ``--workers`` (3) ``conveyor worker --app bench.flow_app:router
--concurrency 16``, in a database of its own (``conveyor_bench_flow``, dropped and made again;
left in place afterwards) and a namespace ``benchflow<random>``. The first worker alone consumes
``flow_solo`` (16 slots: the baseline of one key at ``partition_concurrency=16``).

Jobs are inserted by the harness with ``conveyor.enqueue_many`` (the library's transactional
submit, the statement the API runs), all of a drain in one transaction and due a few seconds
later (``run_at``), so that the statistics are refreshed (``VACUUM ANALYZE``: this machine runs
without autovacuum) before the first one may start; a drain's rate is its jobs over the first
``started_at`` to the last ``finished_at`` (PostgreSQL's clock)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from conveyor import JobSpec, enqueue_many

from . import broker, flow_app, workloads
from .db import Db
from .harness import RESULTS, Harness, Options, free_port
from .run import run as run_loop

APP = "bench.flow_app:router"
DATABASE = "conveyor_bench_flow"
SCENARIOS = ("throughput", "hot_cold", "fair", "rate", "others", "ordered")
README = Path(__file__).parent / "README.md"
CHUNK = 5000  # jobs per enqueue_many statement (all of a drain in one transaction)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- SQL

# A drain: its jobs COMPLETED since ``$2``, from the first start to the last finish.
DRAIN = """
SELECT count(*) AS n, extract(epoch FROM max(finished_at) - min(started_at))::float8 AS seconds
FROM jobs WHERE job_type = $1 AND status = 'COMPLETED' AND created_at >= $2
"""
COMPLETED = """
SELECT count(*) FROM jobs WHERE job_type = $1 AND status = 'COMPLETED' AND finished_at >= $2
"""
# nothing in flight (WAITING jobs may stay: the others scenario's backlog), the outbox empty
BUSY = """
SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('PENDING', 'IN_PROGRESS', 'RETRYING'))
    OR EXISTS (SELECT 1 FROM job_outbox)
"""
VACUUM = "VACUUM ANALYZE jobs, job_outbox, job_attempts, partitions, job_types"
# has a job of a (partitioned) type inserted since $2 started?
STARTED = """
SELECT EXISTS (SELECT 1 FROM jobs WHERE job_type = $1 AND partition_key IS NOT NULL
               AND started_at >= $2)
"""
WAITING = "SELECT count(*) FROM jobs WHERE job_type = $1 AND status = 'WAITING'"
KEYS_WAITING = """
SELECT count(DISTINCT partition_key) FROM jobs
WHERE job_type = $1 AND status = 'WAITING' AND partition_key IS NOT NULL
"""
# the jobs of a type still waiting, cancelled (what a scenario no longer measures)
CANCEL_WAITING = """
SELECT count(cancel_job(id)) FROM jobs WHERE job_type = $1 AND status IN ('WAITING', 'SCHEDULED')
"""
COLD_STARTED = """
SELECT count(*) FROM jobs WHERE job_type = 'flow_hot' AND partition_key LIKE 'cold%'
    AND started_at >= $1
"""
# the cold keys' waits; the hot key's starts per second from the first cold submit to the last
# cold start
COLD = """
WITH cold AS (
    SELECT created_at, started_at, extract(epoch FROM started_at - created_at)::float8 AS wait
    FROM jobs WHERE job_type = 'flow_hot' AND partition_key LIKE 'cold%' AND created_at >= $1
), span AS (SELECT min(created_at) AS a, max(started_at) AS b FROM cold)
SELECT (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY wait) FROM cold) AS p50,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY wait) FROM cold) AS p99,
       (SELECT max(wait) FROM cold) AS max,
       (SELECT count(*) FROM jobs j WHERE j.job_type = 'flow_hot' AND j.partition_key = 'hot'
            AND j.started_at >= span.a AND j.started_at < span.b AND j.created_at >= $1)
        / extract(epoch FROM span.b - span.a)::float8 AS hot_rate,
       extract(epoch FROM span.b - span.a)::float8 AS span_s
FROM span
"""
# Jain's index of the starts per key in each whole window of $2 seconds from the first start,
# up to the first key's last start (from then on keys run out of jobs: a key that has no more
# cannot take its share). A key counts in a window when it waited throughout it: one of its jobs
# was created before the window began and started after it ended (or never).
JAIN = """
WITH j AS (
    SELECT partition_key AS k, created_at, started_at FROM jobs
    WHERE job_type = 'flow_fair' AND created_at >= $1
), w AS (
    SELECT g AS a, g + make_interval(secs => $2::float8) AS b
    FROM (SELECT min(started_at) AS first,
                 (SELECT min(last) FROM (SELECT max(started_at) AS last FROM j GROUP BY k) l)
                     AS last
          FROM j) x,
         generate_series(x.first, x.last - make_interval(secs => $2::float8),
                         make_interval(secs => $2::float8)) AS g
), waited AS (
    SELECT DISTINCT w.a, j.k FROM w JOIN j
        ON j.created_at < w.a AND (j.started_at >= w.b OR j.started_at IS NULL)
), starts AS (
    SELECT w.a, j.k, count(*) AS x FROM w JOIN j ON j.started_at >= w.a AND j.started_at < w.b
    GROUP BY 1, 2
), per AS (
    SELECT waited.a, COALESCE(starts.x, 0)::float8 AS x FROM waited LEFT JOIN starts USING (a, k)
)
SELECT a AS window_start, count(*) AS keys, sum(x)::bigint AS starts,
       COALESCE(sum(x) ^ 2 / NULLIF(count(*) * sum(x * x), 0), 0)::float8 AS jain
FROM per GROUP BY a ORDER BY a
"""
# Starts of each key in every 1 s window (the window before each start, (s - 1 s, s]); all
# starts per second over the $2 seconds from the first; a key's start to its sixth-next.
RATE = """
WITH s AS (
    SELECT partition_key AS k, started_at FROM jobs
    WHERE job_type = 'flow_rate' AND created_at >= $1 AND started_at IS NOT NULL
), c AS (
    SELECT k, started_at,
           count(*) OVER (PARTITION BY k ORDER BY started_at
                          RANGE BETWEEN interval '999999 microseconds' PRECEDING AND CURRENT ROW)
               AS in_window,
           lead(started_at, 5) OVER (PARTITION BY k ORDER BY started_at) AS sixth
    FROM s
)
SELECT max(in_window) AS most, count(*) FILTER (WHERE in_window > 5) AS windows_over,
       (SELECT count(*) FROM s WHERE s.started_at < (SELECT min(started_at) FROM s)
            + make_interval(secs => $2::float8)) / $2::float8 AS per_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM sixth - started_at))
           AS cycle,
       count(*) AS starts
FROM c
"""
# every attempt of the ordered type's jobs, by key in start order: one whose job's place comes
# before the previous attempt's, one begun before the previous one ended, one that skips a place
ORDER = """
WITH a AS (
    SELECT j.partition_key AS k, j.admit_seq AS seq, a.attempt, a.started_at, a.finished_at,
           a.outcome
    FROM jobs j JOIN job_attempts a ON a.job_id = j.id
    WHERE j.job_type = 'flow_ordered' AND j.created_at >= $1
), o AS (
    SELECT a.*, lag(seq) OVER w AS prev_seq, lag(finished_at) OVER w AS prev_end
    FROM a WINDOW w AS (PARTITION BY k ORDER BY started_at, attempt)
)
SELECT count(*) AS attempts, count(DISTINCT k) AS keys,
       count(*) FILTER (WHERE seq < prev_seq) AS out_of_order,
       count(*) FILTER (WHERE seq > prev_seq + 1) AS skipped,
       count(*) FILTER (WHERE started_at < prev_end) AS overlapping,
       count(*) FILTER (WHERE outcome = 'retry') AS retried,
       (SELECT count(*) FROM jobs WHERE job_type = 'flow_ordered' AND created_at >= $1
            AND status <> 'COMPLETED') AS unfinished
FROM o
"""
# the most IN_PROGRESS jobs of one key of a type, now
SAMPLE = """
SELECT COALESCE(max(n), 0) FROM (
    SELECT count(*) AS n FROM jobs WHERE job_type = $1 AND status = 'IN_PROGRESS'
        AND partition_key IS NOT NULL GROUP BY partition_key) x
"""
FUNCTION_CALLS = "SELECT funcname, calls FROM pg_stat_user_functions"
ADMIT_LOCK = "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))"  # as admit() takes it
# How long a freed slot stays empty, with $3 slots: the (i + $3)-th start against the i-th
# finish (finished_at: when the worker's completion was written, which frees the slot for
# admission); p50 and p90 in ms.
REFILL = """
WITH j AS (
    SELECT started_at, finished_at FROM jobs
    WHERE job_type = $1 AND status = 'COMPLETED' AND created_at >= $2
), s AS (SELECT started_at, row_number() OVER (ORDER BY started_at) AS i FROM j),
f AS (SELECT finished_at, row_number() OVER (ORDER BY finished_at) AS i FROM j)
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY e)::float8 AS p50,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY e)::float8 AS p90
FROM (SELECT extract(epoch FROM s.started_at - f.finished_at) * 1000 AS e
      FROM s JOIN f ON s.i = f.i + $3) x
"""


@dataclass
class Figure:
    scenario: str
    name: str
    value: float | None
    target: str  # "≥ 0.70", "≤ 1 s", "= 0", "" (for information)
    ok: bool | None  # None: for information, or not measured
    note: str = ""

    def shown(self) -> str:
        if self.value is None:
            return "-"
        v = self.value
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if v != int(v) else f"{v:.0f}"


@dataclass
class FlowOptions:
    scenarios: list[str]
    scale: float
    workers: int
    concurrency: int
    timeout: float
    database: str
    database_url: str
    amqp_url: str
    output: Path
    readme: bool
    turns: int
    batch_n: int
    batch_repeat: int


def _check(value: float | None, target: str) -> bool | None:
    """``value`` against ``target`` (``≥ x``, ``≤ x``, ``= x``; a unit after the number)."""
    m = re.match(r"^([≥≤=])\s*([0-9.]+)", target)
    if value is None or m is None:
        return None
    limit = float(m.group(2))
    return {"≥": value >= limit, "≤": value <= limit, "=": value == limit}[m.group(1)]


class Flow:
    def __init__(self, o: FlowOptions) -> None:
        self.o = o
        self.h = Harness(
            _harness_options(o),
            database=o.database,
            prefix="benchflow",
            logs=RESULTS / "logs" / "flow",
            app=APP,
            app_types=tuple(flow_app.router.handlers),
        )
        self.figures: list[Figure] = []
        self.details: dict[str, Any] = {}
        self.took: dict[str, float] = {}
        self.failures: dict[str, str] = {}

    @property
    def conn(self) -> Any:
        assert self.h.db is not None
        return self.h.db.conn

    def figure(
        self, scenario: str, name: str, value: float | None, target: str = "", note: str = ""
    ) -> None:
        f = Figure(scenario, name, value, target, _check(value, target), note)
        self.figures.append(f)
        verdict = {True: "pass", False: "MISS", None: ""}[f.ok]
        _say(f"   {name}: {f.shown()} {target} {verdict} {note}".rstrip())

    # ------------------------------------------------------------------ services

    async def start(self) -> None:
        h, o = self.h, self.o
        await h.setup()
        port = free_port()
        h.api_url = f"http://127.0.0.1:{port}"
        h.start_conveyor("api", "api", "--port", str(port))
        h.start_conveyor("publisher", "publisher")
        for i in range(o.workers):
            only = [] if i == 0 else ["--types", ",".join(flow_app.SHARED)]
            h.start_conveyor(
                f"worker{i + 1}", "worker", "--app", APP, "--concurrency", str(o.concurrency), *only
            )
        await h.wait_api()

        async def consuming() -> bool:
            plain = await broker.queue_state(o.amqp_url, f"{h.namespace}.queue.flow_plain")
            solo = await broker.queue_state(o.amqp_url, f"{h.namespace}.queue.flow_solo")
            return bool(plain and solo and plain[1] >= o.workers and solo[1] >= 1)

        await h.poll(consuming, what="every worker consuming", timeout=90, interval=0.3)

    # ------------------------------------------------------------------ helpers

    async def settle(self) -> None:
        """Wait until nothing is in flight, then do what autovacuum would have done by now."""

        async def idle() -> bool:
            return not await self.conn.fetchval(BUSY)

        await self.h.poll(idle, what="the system going idle", timeout=self.o.timeout)
        await self.conn.execute(VACUUM, timeout=600)

    async def submit(
        self,
        job_type: str,
        jobs: Sequence[tuple[str | None, dict[str, Any]]],
        *,
        gate: bool = True,
        due_in: float | None = None,
    ) -> Any:
        """Insert ``jobs`` (partition key, payload) in one transaction; with ``gate``, due a few
        seconds after it commits, once ``VACUUM ANALYZE`` has refreshed the statistics (or
        ``due_in`` seconds from now). Returns the database time before the insert."""
        since = await self.h.db.clock()  # type: ignore[union-attr]
        started = time.monotonic()
        # the insert takes ~0.1 ms a job here, VACUUM ANALYZE about as much again
        lead = due_in if due_in is not None else 2.0 + len(jobs) * 0.0003
        due = since + timedelta(seconds=lead) if gate else None
        async with self.conn.transaction():
            for i in range(0, len(jobs), CHUNK):
                specs = [
                    JobSpec(job_type, payload, partition_key=key, run_at=due)
                    for key, payload in jobs[i : i + CHUNK]
                ]
                await enqueue_many(self.conn, specs)
        if gate:
            await self.conn.execute(VACUUM, timeout=600)
            late = time.monotonic() - started - lead
            if late > 0 and due_in is None:
                _say(f"   (the statistics were refreshed {late:.1f} s after the jobs were due)")
        return since

    async def drain(
        self,
        job_type: str,
        jobs: Sequence[tuple[str | None, dict[str, Any]]],
        *,
        slots: int = 0,
        probe: bool = False,
    ) -> dict[str, Any]:
        """Insert ``jobs`` (gated), wait until all are COMPLETED; their rate, and the CPU each
        process spent meanwhile; with ``slots``, how long a freed slot stayed empty; with
        ``probe`` (a partitioned type), what an admission pass cost 2 s after the first start."""
        await self.settle()
        since = await self.submit(job_type, jobs)
        meter, db_cpu = self.h.cpu_meter(), DbCpu(self.conn)
        await db_cpu.start()
        cost = None
        if probe:
            await self.h.poll(lambda: self._started(job_type, since), what="the first start")
            await asyncio.sleep(2)
            cost = await self.pass_cost(job_type)
        await self.until_completed(job_type, since, len(jobs))
        cpu = {**meter.stop(), "conveyor_db": await db_cpu.stop()}
        row = await self.conn.fetchrow(DRAIN, job_type, since)
        n, seconds = int(row["n"]), float(row["seconds"] or 0)
        out = {
            "type": job_type,
            "jobs": n,
            "seconds": round(seconds, 3),
            "jobs_per_s": round(n / seconds, 2) if seconds > 0 else 0.0,
            "cpu_seconds": cpu,
        }
        if cost is not None:
            out["admission_pass"] = cost
        if slots:
            refill = await self.conn.fetchrow(REFILL, job_type, since, slots)
            out["refill_ms"] = {k: round(v, 1) for k, v in refill.items() if v is not None}
        return out

    async def until_completed(self, job_type: str, since: Any, n: int) -> None:
        async def count() -> int:
            return int(await self.conn.fetchval(COMPLETED, job_type, since))

        countdown = workloads.Countdown(n, count, least=0.1, most=1.0)
        await self.h.poll(
            countdown.done, what=f"{n} {job_type} jobs COMPLETED", interval=countdown.interval
        )

    def n(self, full: int, least: int) -> int:
        return max(least, round(full * self.o.scale))

    # ------------------------------------------------------------------ 1. throughput

    async def throughput(self) -> None:
        """(a) 10,000 keys at partition_concurrency=4 against the same jobs of a type without
        limits; (b) one key at partition_concurrency=16 against the same jobs without limits on
        16 slots (the first worker's; 16/s_b is the ideal of both); (c) a type limited to
        concurrency=4, 0.4 s jobs, against the ideal 10 jobs/s."""
        keys, per_key, secs = self.n(10_000, 500), 2, A_SECONDS
        plain = [(None, {"s": secs})] * (keys * per_key)
        parted = [(f"k{i}", {"s": secs}) for _ in range(per_key) for i in range(keys)]
        ratios, runs = [], []
        for _ in range(self.o.turns):  # in turns: a disturbance hits both sides alike
            a = await self.drain("flow_plain", plain)
            b = await self.drain("flow_p4", parted, probe=True)
            ratios.append(b["jobs_per_s"] / a["jobs_per_s"])
            runs.append({"plain": a, "partitioned": b})
        self.details["throughput_a"] = {"keys": keys, "jobs": keys * per_key, "job_s": secs,
                                        "runs": runs}  # fmt: skip
        cost = runs[-1]["partitioned"]["admission_pass"]
        self.figure(
            "throughput", f"(a) {keys:,} keys at partition_concurrency=4 / no limit",
            statistics.median(ratios), "≥ 0.70",
            f"{_rates(runs, 'partitioned')} vs {_rates(runs, 'plain')} jobs/s, "
            f"{secs} s jobs",
        )  # fmt: skip
        self.figure(
            "throughput", f"(a) an admission pass at {cost['keys']:,} waiting keys, ms",
            cost["ms"], "", f"the gauge's dry pass {cost['dry_ms']:.0f} ms",
        )  # fmt: skip

        n, secs = self.n(2000, 400), B_SECONDS
        ratios, runs = [], []
        for _ in range(self.o.turns):
            a = await self.drain("flow_solo", [(None, {"s": secs})] * n, slots=16)
            b = await self.drain("flow_p16", [("one", {"s": secs})] * n, slots=16)
            ratios.append(b["jobs_per_s"] / a["jobs_per_s"])
            runs.append({"unlimited_16_slots": a, "one_key": b})
        ideal = 16 / secs
        self.details["throughput_b"] = {"jobs": n, "job_s": secs, "ideal": ideal, "runs": runs}
        self.figure(
            "throughput", "(b) one key at partition_concurrency=16 / no limit on 16 slots",
            statistics.median(ratios), "≥ 0.90",
            f"{_rates(runs, 'one_key')} vs {_rates(runs, 'unlimited_16_slots')} jobs/s, "
            f"ideal {ideal:.0f}; a freed slot refilled in {_refill(runs[-1]['one_key'])} vs "
            f"{_refill(runs[-1]['unlimited_16_slots'])} ms",
        )  # fmt: skip

        n = self.n(200, 60)
        c = await self.drain("flow_c4", [(None, {"s": 0.4})] * n, slots=4)
        self.details["throughput_c"] = c
        self.figure(
            "throughput", "(c) concurrency=4, 0.4 s jobs: rate / ideal 10 jobs/s",
            c["jobs_per_s"] / 10, "≥ 0.90",
            f"{c['jobs_per_s']:.2f} jobs/s, {n} jobs; a freed slot refilled in {_refill(c)} ms",
        )  # fmt: skip

    # ------------------------------------------------------------------ 2. hot and cold

    async def hot_cold(self) -> None:
        """One key with a backlog of 0.02 s jobs (100,000 at full size) while 50 other keys
        submit one job each (``POST /jobs`` with ``partition_key``) at random moments: the
        cold jobs' start latency (``started_at - created_at``), and the hot key's start rate
        meanwhile against a drain of the same jobs of a type without limits."""
        secs = 0.02
        base = await self.drain("flow_plain", [(None, {"s": secs})] * self.n(20_000, 3000))
        n = self.n(100_000, 10_000)
        await self.settle()
        since = await self.submit("flow_hot", [("hot", {"s": secs})] * n)
        await self.h.poll(
            lambda: self._started("flow_hot", since),
            what="the hot key's first start",
            interval=0.05,
        )
        # the cold keys arrive while the hot key has a backlog: over half the time the hot
        # key's jobs would take at the unlimited rate, at most a minute
        window = min(60.0, 0.5 * n / base["jobs_per_s"])
        meter, db_cpu = self.h.cpu_meter(), DbCpu(self.conn)
        await db_cpu.start()
        rnd = random.Random(7)
        moments = sorted(rnd.uniform(0.5, window) for _ in range(COLD_KEYS))
        async with httpx.AsyncClient(base_url=self.h.api_url, timeout=10) as client:
            t0 = time.monotonic()
            for i, at in enumerate(moments):
                await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
                body = {"type": "flow_hot", "payload": {"s": secs}, "partition_key": f"cold{i}"}
                r = await client.post("/jobs", json=body)
                r.raise_for_status()

        async def cold_started() -> bool:
            return bool(await self.conn.fetchval(COLD_STARTED, since) >= COLD_KEYS)

        await self.h.poll(cold_started, what="the cold keys' jobs starting", interval=0.2)
        cpu = {**meter.stop(), "conveyor_db": await db_cpu.stop()}
        row = await self.conn.fetchrow(COLD, since)
        left = await self.conn.fetchval(CANCEL_WAITING, "flow_hot")  # the rest is not measured
        self.details["hot_cold"] = {"baseline": base, "hot_jobs": n, "window_s": round(window, 1),
                                    "cancelled_after": left, "cpu_seconds": cpu,
                                    **dict(row)}  # fmt: skip
        self.figure("hot_cold", "cold keys' start latency p99, s", row["p99"], "≤ 1",
                    f"p50 {row['p50']:.3f} s, {COLD_KEYS} keys over {window:.0f} s, "
                    f"beside {n:,} hot jobs")  # fmt: skip
        self.figure("hot_cold", "cold keys' start latency max, s", row["max"], "≤ 2")
        self.figure(
            "hot_cold", "hot key's start rate meanwhile / no limit",
            row["hot_rate"] / base["jobs_per_s"], "≥ 0.5",
            f"{row['hot_rate']:.0f} vs {base['jobs_per_s']:.0f} jobs/s",
        )  # fmt: skip

    async def _started(self, job_type: str, since: Any) -> bool:
        return bool(await self.conn.fetchval(STARTED, job_type, since))

    # ------------------------------------------------------------------ 3. fair at scale

    async def fair(self) -> None:
        """10,000 keys with a backlog each: Jain's index of the starts per key in every 10 s
        window. A key counts in a window when it waited throughout it: one of its jobs was
        created before the window began and started after it ended (or never). Whole windows
        from the first start until the first key runs out of jobs (``JAIN``)."""
        keys = self.n(10_000, 1000)
        per_key = max(5, math.ceil(self.n(50_000, 40_000) / keys))
        jobs = [(f"f{i}", {"s": FAIR_SECONDS}) for _ in range(per_key) for i in range(keys)]
        await self.settle()
        since = await self.submit("flow_fair", jobs)
        await self.h.poll(lambda: self._started("flow_fair", since), what="the first start")
        await asyncio.sleep(3)
        cost = await self.pass_cost("flow_fair")
        await self.until_completed("flow_fair", since, len(jobs))
        windows = [dict(r) for r in await self.conn.fetch(JAIN, since, FAIR_WINDOW)]
        whole = [w for w in windows if w["keys"]]
        self.details["fair"] = {"keys": keys, "per_key": per_key, "job_s": FAIR_SECONDS,
                                "admission_pass": cost, "windows": whole}  # fmt: skip
        if not whole:
            raise RuntimeError("no whole window with waiting keys: too few jobs")
        worst = min(whole, key=lambda w: w["jain"])
        ideal = _round_robin_jain(worst["starts"], worst["keys"])
        note = (f"{len(whole)} windows, worst: {worst['starts']:,} starts over {worst['keys']:,} "
                f"keys")  # fmt: skip
        if ideal < 0.9:
            note += f"; a perfect round robin would score {ideal:.2f}: too few starts per window"
        self.figure("fair", f"Jain's index per {FAIR_WINDOW:.0f} s window, {keys:,} keys, min",
                    worst["jain"], "≥ 0.9", note)  # fmt: skip
        rel = min(w["jain"] / _round_robin_jain(w["starts"], w["keys"]) for w in whole)
        self.figure("fair", "the same / a perfect round robin's with those starts, min", rel,
                    "≥ 0.9")  # fmt: skip
        self.figure("fair", f"an admission pass at {cost['keys']:,} waiting keys, ms",
                    cost["ms"], "", f"the gauge's dry pass {cost['dry_ms']:.0f} ms")  # fmt: skip

    async def pass_cost(self, job_type: str) -> dict[str, Any]:
        """What one admission pass of ``job_type`` costs now, median of 3, on a connection of
        its own: a real pass (``admit(type, window)``, rolled back; the type's admission lock
        taken first, so that the time is the pass's own, not a wait for the admitter's), and
        the dry pass of the admissible gauge (``admit(type, 0, true)``, every 5 s)."""
        conn = await _connect(self.h.db_url)
        schema = self.h.db.schema  # type: ignore[union-attr]
        window = int(os.environ.get("CONVEYOR_ADMISSION_WINDOW", "200"))
        real, dry = [], []
        try:
            keys = await conn.fetchval(KEYS_WAITING, job_type)
            for _ in range(3):
                tx = conn.transaction()
                await tx.start()
                try:
                    await conn.execute(ADMIT_LOCK, f"{schema}.admit", job_type)
                    t = time.perf_counter()
                    await conn.fetchval("SELECT admit($1, $2)", job_type, window)
                    real.append((time.perf_counter() - t) * 1000)
                finally:
                    await tx.rollback()
                t = time.perf_counter()
                await conn.fetchval("SELECT admit($1, 0, true)", job_type)
                dry.append((time.perf_counter() - t) * 1000)
        finally:
            await conn.close()
        return {"ms": round(statistics.median(real), 1), "dry_ms": round(statistics.median(dry), 1),
                "keys": keys, "window": window}  # fmt: skip

    # ------------------------------------------------------------------ 4. rate

    async def rate(self) -> None:
        """100 keys at partition_rate_limit="5/s" for 60 s (scaled; at least 20 s): the most
        starts of one key in any 1 s window (sliding, from ``started_at``), and all starts
        against the 500/s the limits allow."""
        keys, seconds = RATE_KEYS, max(20.0, 60.0 * self.o.scale)
        per_key = math.ceil(5 * seconds * 1.2) + 10  # none runs out before the end
        jobs = [(f"r{i}", {"s": RATE_SECONDS}) for _ in range(per_key) for i in range(keys)]
        await self.settle()
        since = await self.submit("flow_rate", jobs)
        await self.h.poll(lambda: self._started("flow_rate", since), what="the first start")
        await asyncio.sleep(seconds + 1)
        left = await self.conn.fetchval(CANCEL_WAITING, "flow_rate")
        await self.settle()
        row = dict(await self.conn.fetchrow(RATE, since, seconds))
        self.details["rate"] = {"keys": keys, "seconds": seconds, "jobs": len(jobs),
                                "cancelled_after": left, **row}  # fmt: skip
        self.figure("rate", "most starts of one key in a 1 s window", row["most"], "≤ 5",
                    f"{row['windows_over']} windows over")  # fmt: skip
        self.figure(
            "rate", f"starts per second / 500 ({keys} keys x 5/s, {seconds:.0f} s)",
            row["per_s"] / (5 * keys), "≥ 0.90",
            f"{row['per_s']:.0f}/s; a key's 6th start comes {row['cycle']:.3f} s after its 1st",
        )  # fmt: skip

    # ------------------------------------------------------------------ 5. others pay nothing

    async def others(self) -> None:
        """The plain batch workload (``bench.workloads``: ``POST /jobs/batch`` of 500 no-op
        jobs, submit to all COMPLETED) without and with a partitioned backlog waiting beside it
        (10,000 keys x 10 jobs at full size, due in a day: every admission pass looks at every
        key and admits nothing), ``--batch-repeat`` runs each; then beside the backlog with its
        type paused (its rows stay, its passes stop), and alone again once it is cancelled
        (A B A: a drift of the machine hits both sides); medians compared. Then the statements
        of the submit path per job."""
        o = self.o

        async def batches(label: str) -> list[dict[str, Any]]:
            runs = []
            for i in range(o.batch_repeat):
                await self.settle()
                db_cpu = DbCpu(self.conn)
                await db_cpu.start()
                r = await workloads.submitted(self.h, "batch", o.batch_n, procs=1, connections=2)
                r.pop("since", None)
                r["cpu_seconds"]["conveyor_db"] = await db_cpu.stop()
                _say(f"   batch, {label} [{i + 1}/{o.batch_repeat}]: {r['jobs_per_s']} jobs/s")
                runs.append(r)
            return runs

        alone = await batches("alone")
        keys = self.n(10_000, 1000)
        backlog = [(f"b{i}", {}) for _ in range(BACKLOG_PER_KEY) for i in range(keys)]
        await self.submit("flow_backlog", backlog, due_in=BACKLOG_DUE_IN)
        waiting = await self.conn.fetchval(WAITING, "flow_backlog")
        cost = await self.pass_cost("flow_backlog")
        beside = await batches(f"beside {waiting:,} waiting jobs")
        await self.conn.execute("UPDATE job_types SET paused = true WHERE name = 'flow_backlog'")
        paused = await batches("beside them, their type paused")
        await self.conn.execute(CANCEL_WAITING, "flow_backlog")
        await self.conn.execute("UPDATE job_types SET paused = false WHERE name = 'flow_backlog'")
        alone += await batches("alone again, the backlog cancelled")

        def med(runs: list[dict[str, Any]]) -> float:
            return float(statistics.median(r["jobs_per_s"] for r in runs))

        def db_ms(runs: list[dict[str, Any]]) -> float:  # our database's CPU per job
            return statistics.median(r["cpu_seconds"]["conveyor_db"] / r["jobs"] for r in runs)

        self.details["others"] = {
            "backlog_keys": keys, "backlog_waiting": waiting, "admission_pass": cost,
            "alone": alone, "beside": beside, "beside_paused": paused,
        }  # fmt: skip
        self.figure(
            "others", f"plain batch beside {waiting:,} waiting partitioned jobs / alone",
            med(beside) / med(alone), "≥ 0.95",
            f"{med(beside):.0f} vs {med(alone):.0f} jobs/s; PostgreSQL "
            f"{db_ms(beside) * 1000:.2f} vs {db_ms(alone) * 1000:.2f} ms CPU per job",
        )  # fmt: skip
        self.figure(
            "others", "the same, the backlog's type paused / alone", med(paused) / med(alone),
            "", f"{med(paused):.0f} jobs/s; PostgreSQL {db_ms(paused) * 1000:.2f} ms per job",
        )  # fmt: skip
        self.figure("others", f"an admission pass at {cost['keys']:,} keys due in a day, ms",
                    cost["ms"], "", f"the gauge's dry pass {cost['dry_ms']:.0f} ms")  # fmt: skip
        await self.statements()

    async def statements(self) -> None:
        """Statements of the submit path per job, from the server's log: a second ``conveyor
        api`` whose sessions log every statement (``log_statement=all`` through the URL, which
        asyncpg passes as session settings; no other session of the run logs any) and count
        function calls (``track_functions=all``). The same number of ``POST /jobs/batch``
        requests of 500 and of 50 jobs: a statement run per job would add one per job to the
        larger ones, so the difference over the jobs' difference is the statements per job
        beyond the per-request ones (0 when there is none). Plain no-op jobs, then jobs of a
        partitioned type for comparison; and the admission functions the plain ones called."""
        log = _server_log(self.h.servers.get("postgres"))
        if log is None:
            self.figure("others", "statements per plain job", None, "≤ 0.01",
                        "the server's log cannot be read here")  # fmt: skip
            return
        url = self.h.db_url + "?log_statement=all&log_parameter_max_length=0&track_functions=all"
        env = {**self.h.env, "CONVEYOR_DATABASE_URL": url}
        dbname = self.h.db_url.rsplit("/", 1)[1]
        counts: dict[str, dict[int, tuple[int, dict[str, int]]]] = {}
        calls: dict[str, dict[str, int]] = {}
        for job_type in ("noop", "flow_fair"):
            port = free_port()
            self.h.start("api-statements", [self.h.conveyor, "api", "--port", str(port)], env)
            before = await self.conn.fetch(FUNCTION_CALLS)
            counts[job_type] = {}
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                    await self.h.poll(lambda: _healthy(client), what="the second API", timeout=60)
                    for size in (50, 500):
                        start = log.stat().st_size
                        for r in range(STATEMENT_REQUESTS):
                            jobs: list[dict[str, Any]] = [
                                {"type": job_type, "payload": {}} for _ in range(size)
                            ]
                            if job_type != "noop":
                                for i, job in enumerate(jobs):
                                    job["partition_key"] = f"s{r}-{i}"
                            resp = await client.post("/jobs/batch", json={"jobs": jobs}, timeout=30)
                            resp.raise_for_status()
                        await asyncio.sleep(0.5)  # the log written
                        counts[job_type][size] = _statements(log, start, dbname)
            finally:
                self.h.stop("api-statements")  # its sessions' function counts are flushed
            await asyncio.sleep(0.5)
            calls[job_type] = _delta(before, await self.conn.fetch(FUNCTION_CALLS))
        jobs_more = STATEMENT_REQUESTS * (500 - 50)
        # each statement's count in the larger requests less in the smaller, per job more: 1
        # for a statement run per job, about 0 for one run per request (or in the background)
        per_job = {
            t: max(
                (c[500][1].get(k, 0) - c[50][1].get(k, 0)) / jobs_more
                for k in {*c[500][1], *c[50][1]}
            )
            for t, c in counts.items()
        }
        admission = ("partition_key_for", "ordered_place", "admit", "admissible")
        plain_calls = sum(calls["noop"].get(f, 0) for f in admission)
        self.details["statements"] = {
            "requests": STATEMENT_REQUESTS, "log": str(log),
            "counts": {t: {s: {"total": n, "by_statement": by} for s, (n, by) in c.items()}
                       for t, c in counts.items()},
            "function_calls": calls,
        }  # fmt: skip
        plain = counts["noop"]
        self.figure(
            "others", "statements run per plain job (the most of any statement)", per_job["noop"],
            "≤ 0.01",
            f"{plain[500][0] / STATEMENT_REQUESTS:.1f} statements per request of 500, "
            f"{plain[50][0] / STATEMENT_REQUESTS:.1f} of 50; partitioned jobs: "
            f"{per_job['flow_fair']:.3f} per job",
        )  # fmt: skip
        self.figure(
            "others", "admission functions called by plain submits", plain_calls, "= 0",
            "partitioned: " + ", ".join(f"{f} {calls['flow_fair'].get(f, 0)}" for f in admission),
        )  # fmt: skip

    # ------------------------------------------------------------------ 6. ordered

    async def ordered(self) -> None:
        """1,000 keys x 20 jobs of an ordered type, a tenth of them failing their first attempt
        (retried after 1 s): from every attempt (``job_attempts``), each key started its jobs in
        ``admit_seq`` order (a retry repeats its place) and no attempt began before the key's
        previous one ended; and IN_PROGRESS jobs per key sampled every 100 ms."""
        keys, per_key = self.n(1000, 100), 20
        rnd = random.Random(11)
        jobs = [(f"o{i}", {"s": ORDERED_SECONDS, "fail": rnd.random() < 0.1})
                for _ in range(per_key) for i in range(keys)]  # fmt: skip
        await self.settle()
        since = await self.submit("flow_ordered", jobs)
        samples = Sampler(self.h.db_url, ORDERED_SAMPLE, "flow_ordered")
        async with samples:
            await self.until_completed("flow_ordered", since, len(jobs))
        row = dict(await self.conn.fetchrow(ORDER, since))
        self.details["ordered"] = {"keys": keys, "per_key": per_key, **row,
                                   "samples": samples.n, "most_in_progress": samples.most,
                                   "samples_over": samples.over}  # fmt: skip
        self.figure("ordered", "attempts started out of admit_seq order", row["out_of_order"],
                    "= 0", f"{row['attempts']:,} attempts, {row['retried']:,} retried, "
                    f"{keys:,} keys x {per_key}")  # fmt: skip
        self.figure("ordered", "attempts begun before the key's previous one ended",
                    row["overlapping"], "= 0")  # fmt: skip
        self.figure("ordered", "most IN_PROGRESS jobs of one key, sampled every 0.1 s",
                    samples.most, "≤ 1", f"{samples.n} samples")  # fmt: skip

    # ------------------------------------------------------------------ the run

    async def run(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            await self.start()
            _say(f"namespace {self.h.namespace}, database {self.h.db_url}, logs in {self.h.logs}")
            for name in self.o.scenarios:
                _say(f"== {name} ...")
                t = time.monotonic()
                try:
                    await getattr(self, name)()
                except Exception as exc:
                    self.failures[name] = f"{type(exc).__name__}: {exc}"
                    _say(f"!! {name} FAILED: {self.failures[name]}\n{self.h.tails()}")
                    with contextlib.suppress(Exception):
                        await self.cancel_waiting()
                self.took[name] = round(time.monotonic() - t, 1)
                _say(f"   ({name}: {self.took[name]:.0f} s)")
        finally:
            await self.h.close()
        return {
            "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "params": {**asdict(self.o), "output": str(self.o.output)},
            "seconds": round(time.monotonic() - started, 1),
            "took": self.took,
            "figures": [asdict(f) for f in self.figures],
            "details": self.details,
            "failures": self.failures,
            "loadavg": os.getloadavg(),
        }

    async def cancel_waiting(self) -> None:
        """Cancel every job still waiting (after a failed scenario, so the next starts clean)."""
        await self.conn.execute(
            "SELECT count(cancel_job(id)) FROM jobs WHERE status IN ('WAITING', 'SCHEDULED')"
        )


A_SECONDS = 0.1  # throughput (a): the job's sleep
B_SECONDS = 0.1  # throughput (b)
COLD_KEYS = 50  # hot_cold
FAIR_SECONDS, FAIR_WINDOW = 0.02, 10.0  # fair: the job's sleep, the window
RATE_KEYS, RATE_SECONDS = 100, 0.01  # rate
BACKLOG_PER_KEY, BACKLOG_DUE_IN = 10, 86400.0  # others: jobs per key of the backlog, due in
STATEMENT_REQUESTS = 10  # others: batch requests of each size in the statement count
ORDERED_SECONDS, ORDERED_SAMPLE = 0.02, 0.1  # ordered: the job's sleep, the sampling interval


def _round_robin_jain(starts: int, keys: int) -> float:
    """Jain's index of ``starts`` dealt to ``keys`` in turn (each gets q or q + 1)."""
    if starts <= 0 or keys <= 0:
        return 0.0
    q, r = divmod(starts, keys)
    return starts**2 / (keys * (r * (q + 1) ** 2 + (keys - r) * q**2))


async def _connect(url: str) -> Any:
    return (await Db.connect(url)).conn


class DbCpu:
    """CPU seconds of this run's database sessions (the PostgreSQL backends of its database)
    between ``start`` and ``stop``: the server's work for the run, apart from other sessions on
    the same server (the ``postgres`` role of ``CpuMeter`` is the whole server). A session
    that ended in between is missed; one that began is counted whole."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.before: dict[int, float] = {}

    async def _snapshot(self) -> dict[int, float]:
        pids = await self.conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        )
        out = {}
        for (pid,) in pids:
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(pid).cpu_times()
                out[pid] = t.user + t.system
        return out

    async def start(self) -> None:
        self.before = await self._snapshot()

    async def stop(self) -> float:
        after = await self._snapshot()
        return round(sum(cpu - self.before.get(pid, 0.0) for pid, cpu in after.items()), 2)


class Sampler:
    """The most IN_PROGRESS jobs of one key of ``job_type``, sampled every ``interval`` s on
    a connection of its own while the ``async with`` block runs."""

    def __init__(self, url: str, interval: float, job_type: str) -> None:
        self.url, self.interval, self.job_type = url, interval, job_type
        self.n = self.most = self.over = 0
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None

    async def __aenter__(self) -> Sampler:
        self._conn = await _connect(self.url)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._conn.close()

    async def _loop(self) -> None:
        while True:
            most = int(await self._conn.fetchval(SAMPLE, self.job_type))
            self.n += 1
            self.most = max(self.most, most)
            self.over += most > 1
            await asyncio.sleep(self.interval)


def _server_log(postmaster: int | None) -> Path | None:
    """The file the local PostgreSQL writes its log to (its stderr), when this process may read
    it; None otherwise."""
    if postmaster is None:
        return None
    with contextlib.suppress(OSError):
        path = Path(os.readlink(f"/proc/{postmaster}/fd/2"))
        if path.is_file() and os.access(path, os.R_OK):
            return path
    return None


_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d ")  # a line of its own (else a statement's next line)
_LOGGED = re.compile(r"@(\S+) LOG:  (?:statement|execute [^:]*): (.*)$")


def _statements(log: Path, start: int, dbname: str) -> tuple[int, dict[str, int]]:
    """The statements ``dbname``'s sessions logged after byte ``start``: how many, and how many
    of each (by their first 60 characters, the lines after the first one included)."""
    texts: list[str] = []
    current: list[str] | None = None
    with log.open("rb") as f:
        f.seek(start)
        for raw in f:
            line = raw.decode(errors="replace").rstrip("\n")
            if not _PREFIX.match(line):
                if current is not None:
                    current.append(line)
                continue
            if current is not None:
                texts.append(" ".join(" ".join(current).split())[:60])
            m = _LOGGED.search(line)
            current = [m.group(2)] if m and m.group(1) == dbname else None
        if current is not None:
            texts.append(" ".join(" ".join(current).split())[:60])
    by: dict[str, int] = {}
    for text in texts:
        by[text] = by.get(text, 0) + 1
    return len(texts), dict(sorted(by.items(), key=lambda kv: -kv[1]))


def _delta(before: Sequence[Any], after: Sequence[Any]) -> dict[str, int]:
    was = {r["funcname"]: r["calls"] for r in before}
    out = {r["funcname"]: r["calls"] - was.get(r["funcname"], 0) for r in after}
    return {k: v for k, v in out.items() if v}


async def _healthy(client: httpx.AsyncClient) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return (await client.get("/healthz")).status_code == 200
    return False


def _refill(drain: dict[str, Any]) -> str:
    r = drain.get("refill_ms") or {}
    return f"{r.get('p50', float('nan')):.0f} (p90 {r.get('p90', float('nan')):.0f})"


def _rates(runs: list[dict[str, Any]], side: str) -> str:
    return "/".join(f"{r[side]['jobs_per_s']:.0f}" for r in runs)


def _harness_options(o: FlowOptions) -> Options:
    return Options(
        quick=True, n=o.batch_n, rest_n=o.batch_n, latency_seconds=0, latency_rate=0,
        connections=2, client_procs=1, batch_size=500, batch_connections=2,
        concurrency=o.concurrency, celery_pools=[], with_backfill=False, backfill_rows=0,
        backfill_repeat=1, timeout=o.timeout, http_client="raw", profile=False, repeat=1,
        database_url=o.database_url, amqp_url=o.amqp_url, output=o.output,
    )  # fmt: skip


def parse(argv: list[str] | None = None) -> FlowOptions:
    p = argparse.ArgumentParser(prog="python -m bench.flow", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--scenario", action="append", choices=SCENARIOS,
                   help="a scenario to run (repeatable; default: all, in this order: "
                   + ", ".join(SCENARIOS) + ")")  # fmt: skip
    p.add_argument("--scale", type=float, default=1.0,
                   help="sizes times this (1: the full sizes where this machine can run them; "
                   "--quick: 0.1)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="--scale 0.1: a few minutes")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16, help="each worker's (16)")
    p.add_argument("--turns", type=int, default=1,
                   help="throughput: runs of each side in turns; median ratio (1)")  # fmt: skip
    p.add_argument("--batch-n", type=int, help="others: jobs per plain batch run (20000 x scale)")
    p.add_argument("--batch-repeat", type=int, default=3,
                   help="others: batch runs on each side; medians compared (3)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per wait (600)")
    p.add_argument("--database", default=os.environ.get("CONVEYOR_BENCH_FLOW_DATABASE", DATABASE))
    p.add_argument("--readme", action="store_true",
                   help="write the table into bench/README.md (make bench-flow does)")  # fmt: skip
    p.add_argument("--output", type=Path, default=RESULTS / "flow.json")
    a = p.parse_args(argv)
    scale = 0.1 if a.quick and a.scale == 1.0 else a.scale
    return FlowOptions(
        scenarios=a.scenario or list(SCENARIOS),
        scale=scale,
        workers=a.workers,
        concurrency=a.concurrency,
        timeout=a.timeout,
        database=a.database,
        database_url=os.environ.get(
            "CONVEYOR_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/conveyor"
        ),
        amqp_url=os.environ.get("CONVEYOR_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
        output=a.output,
        readme=a.readme,
        turns=max(1, a.turns),
        batch_n=a.batch_n or max(3000, round(20_000 * scale)),
        batch_repeat=max(1, a.batch_repeat),
    )


async def main(o: FlowOptions) -> int:
    data = await Flow(o).run()
    o.output.parent.mkdir(parents=True, exist_ok=True)
    o.output.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    text = report(data)
    print(text)
    print(f"\nwrote {o.output}")
    if o.readme:
        write_readme(text)
        print(f"wrote the table into {README}")
    if data["failures"]:
        print("failures:\n" + "\n".join(f"  {k}: {v}" for k, v in data["failures"].items()))
        return 1
    return 0


def table(data: dict[str, Any]) -> str:
    rows = ["| scenario | figure | value | target | result |", "| --- | --- | --- | --- | --- |"]
    for f in data["figures"]:
        fig = Figure(**f)
        verdict = {True: "pass", False: "**miss**", None: ""}[fig.ok]
        name = fig.name + (f" ({fig.note})" if fig.note else "")
        rows.append(f"| {fig.scenario} | {name} | {fig.shown()} | {fig.target} | {verdict} |")
    return "\n".join(rows)


def report(data: dict[str, Any]) -> str:
    """The table, then how long each scenario took and how busy the machine was."""
    p = data["params"]
    took = ", ".join(f"{k} {v:.0f} s" for k, v in data["took"].items())
    load = "/".join(f"{x:.1f}" for x in data["loadavg"])
    return (
        f"{table(data)}\n\n"
        f"Scale {p['scale']:g}, {p['workers']} workers x {p['concurrency']} slots; took: {took} "
        f"(load average at the end {load} on {os.cpu_count()} CPUs)."
    )


BEGIN, END = "<!-- bench-flow: begin -->", "<!-- bench-flow: end -->"


def write_readme(text: str) -> None:
    """Replace what stands between the markers in bench/README.md with ``text``."""
    readme = README.read_text()
    a, b = readme.find(BEGIN), readme.find(END)
    if a < 0 or b < a:
        raise SystemExit(f"{README} has no {BEGIN} ... {END} section")
    README.write_text(readme[: a + len(BEGIN)] + "\n" + text + "\n" + readme[b:])


if __name__ == "__main__":
    try:
        sys.exit(run_loop(main(parse())))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: every benchmark process was stopped", file=sys.stderr)
        sys.exit(130)
