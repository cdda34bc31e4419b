"""``python -m bench.run [--quick] [--with-backfill]``: Conveyor against Celery on the local
PostgreSQL and RabbitMQ. Prints a markdown table and writes ``bench/results/latest.json``.

Every service runs as its own process, as in production (``conveyor api``, ``conveyor
publisher``, ``conveyor worker --app bench.app:router``), against a fresh database
(``conveyor_bench``) and a namespace of its own on the shared broker. See bench/README.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import re
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import profile, report, workloads
from . import workflows as workflow_bench
from .harness import RESULTS, Harness, Options, free_port

STEPS = ["relay", "drain", "rest", "batch", "latency", "workflow", "batch_backfill", "celery"]
CONVEYOR_STEPS = STEPS[:-1]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Runner:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.h = Harness(opts)
        self.details: dict[str, Any] = {}
        self.failures: dict[str, str] = {}
        self.broken: str | None = None

    async def best_of(
        self,
        name: str,
        work: Callable[[], Awaitable[Any]],
        *,
        key: str = "jobs_per_s",
        lower_is_better: bool = False,
    ) -> dict[str, Any] | None:
        """``--repeat`` runs of a workload; the best by ``key`` (all of them under ``runs``).
        On a shared machine the best run is the least disturbed one."""
        results: list[dict[str, Any]] = []
        repeat = self.opts.repeat
        for i in range(repeat):
            label = name if repeat == 1 else f"{name} [{i + 1}/{repeat}]"
            result = _drop_since(await self.step(name, work, label=label))
            if result is None:
                break
            results.append(result)
        if not results:
            return None
        pick = min if lower_is_better else max
        best = pick(results, key=lambda r: float(r[key] or 0))
        if len(results) > 1:
            best = {**best, "runs": [r[key] for r in results]}
        return best

    async def step(
        self, name: str, work: Callable[[], Awaitable[Any]], *, label: str | None = None
    ) -> Any:
        """Run one workload; a failure is recorded (with the services' last log lines) and the
        remaining Conveyor workloads are skipped, since a backlog would distort them."""
        if name in self.opts.skip:
            return None
        if self.broken is not None and name in CONVEYOR_STEPS:
            self.failures[name] = f"skipped: {self.broken} failed before it"
            return None
        label = label or name
        _say(f"== {label} ...")
        started = time.monotonic()
        try:
            with self.profiling(re.sub(r"[^A-Za-z0-9_]+", "-", label).strip("-")):
                result = await work()
        except Exception as exc:  # a timeout, a dead service, a failed submit
            message = f"{type(exc).__name__}: {exc}"
            self.failures[name] = message
            if name in CONVEYOR_STEPS:
                self.broken = name
            _say(f"!! {label} FAILED after {time.monotonic() - started:.1f} s: {message}")
            _say(self.h.tails())
            return None
        _say(f"   {label}: {_brief(result)}  ({time.monotonic() - started:.1f} s)")
        return result

    @contextlib.contextmanager
    def profiling(self, workload: str) -> Iterator[None]:
        spy = profile.py_spy() if self.opts.profile else None
        pids = {n: s.pid for n, s in self.h.services.items() if n in ("api", "publisher", "worker")}
        if spy is None or not pids:
            yield
            return
        with profile.record(spy, pids, RESULTS / "profiles", workload) as files:
            yield
        for path in files:
            _say(f"   py-spy {path.name}: samples in subtree")
            for pct, frame in profile.hottest(path):
                _say(f"     {pct:5.1f}%  {frame}")

    async def conveyor(self) -> None:
        o, h = self.opts, self.h
        port = free_port()
        h.api_url = f"http://127.0.0.1:{port}"
        h.start_conveyor("api", "api", "--port", str(port), "--workers", str(o.api_workers))
        h.start_conveyor("publisher", "publisher")
        await h.wait_api()

        relayed = await self.step("relay", lambda: workloads.relay(h, o.n))
        if relayed is not None:
            self.details["relay"], since = relayed
            self.details["drain"] = await self.step("drain", lambda: workloads.drain(h, o.n, since))
        if "worker" not in h.services and self.broken is None:
            h.start_conveyor("worker", "worker", "--app", "bench.app:router",
                             "--concurrency", str(o.concurrency))  # fmt: skip
        if self.broken is None:
            await h.wait_consumer(f"{h.namespace}.queue.noop")
        else:
            _say("   (the Conveyor workloads after a failure are skipped)")
        rest = dict(procs=o.client_procs, connections=o.connections)
        batch = dict(procs=1, connections=o.batch_connections)
        self.details["rest"] = await self.best_of(
            "rest", lambda: workloads.submitted(h, "rest", o.rest_n, **rest)
        )
        self.details["batch"] = await self.best_of(
            "batch", lambda: workloads.submitted(h, "batch", o.n, **batch)
        )
        self.details["latency"] = await self.best_of(
            "latency",
            lambda: workloads.latency(h, o.latency_seconds, o.latency_rate),
            key="p99",
            lower_is_better=True,
        )
        self.details["workflow"] = await self.step(
            "workflow", lambda: workflow_bench.run(h, o.repeat)
        )
        if o.with_backfill:
            self.details["batch_backfill"] = await self.backfilled(batch)
        exits = {}
        for name in ("worker", "publisher", "api"):  # a worker drains on SIGTERM and exits 0
            if name in h.services:
                exits[name] = h.stop(name, grace=30)
        self.details["conveyor_exit_codes"] = exits

    async def backfilled(self, batch: dict[str, Any]) -> dict[str, Any] | None:
        """The target: with 10 million rows in ``jobs``, a batch rate ≥ 90 % of the empty-table
        rate. The batch workload ``--backfill-repeat`` times on the table as it is (the run's
        own few thousand rows), then ``--backfill-rows`` jobs of a busy install generated in SQL
        (``db.INSERT_BACKFILL``) and ``VACUUM ANALYZE``, then the workload as many times again;
        the medians are compared. Medians of runs on both sides, not the one headline batch
        figure, so one disturbed run on either side moves the ratio little."""
        o, h = self.opts, self.h

        async def runs(label: str) -> list[dict[str, Any]]:
            out = []
            for i in range(o.backfill_repeat):
                result = _drop_since(
                    await self.step(
                        "batch_backfill",
                        lambda: workloads.submitted(h, "batch", o.n, **batch),
                        label=f"batch, {label} [{i + 1}/{o.backfill_repeat}]",
                    )
                )
                if result is None:
                    break
                out.append(result)
            return out

        empty = await runs("before the backfill")

        async def fill() -> float:
            _say(f"   generating {o.backfill_rows:,} jobs and their attempts ...")
            return await workloads.backfill(h, o.backfill_rows, _say)

        took = await self.step("batch_backfill", fill, label="backfill")
        if not empty or took is None:
            return None
        full = await runs(f"{o.backfill_rows:,} rows")
        if not full:
            return None
        rate = statistics.median(r["jobs_per_s"] for r in full)
        empty_rate = statistics.median(r["jobs_per_s"] for r in empty)
        middle = sorted(full, key=lambda r: r["jobs_per_s"])[len(full) // 2]
        return {
            **middle,
            "jobs_per_s": round(rate, 1),
            "empty_jobs_per_s": round(empty_rate, 1),
            "vs_empty": round(rate / empty_rate, 3),
            "runs": [r["jobs_per_s"] for r in full],
            "empty_runs": [r["jobs_per_s"] for r in empty],
            "backfill_rows": o.backfill_rows,
            "backfill_s": took,
            "table": await workloads.table_size(h),
        }

    async def celery(self) -> None:
        """Each of Celery's configurations in turn; the fastest end to end is the one compared
        (``details.celery``), every one's figures under ``details.celery.pools``."""
        o, pools = self.opts, {}
        for pool in o.celery_pools:
            result = await self.step(
                "celery",
                functools.partial(workloads.celery, self.h, o.n, o.repeat, pool),
                label=f"celery ({pool})",
            )
            if result is not None:
                pools[pool] = result
        if pools:
            best = max(pools.values(), key=lambda r: float(r["jobs_per_s"] or 0))
            keys = ("jobs_per_s", "drain_jobs_per_s", "worker_processes", "rss_mb")
            summary = {p: {k: r.get(k) for k in keys} for p, r in pools.items()}
            self.details["celery"] = {**best, "pools": summary}

    async def run(self) -> dict[str, Any]:
        o, h = self.opts, self.h
        try:
            try:
                db = await h.setup()
                machine = await report.machine(db, o.amqp_url)
            except Exception as exc:
                raise SystemExit(
                    f"bench: cannot prepare the run: {type(exc).__name__}: {exc}"
                ) from None
            _say(f"namespace {h.namespace}, database {h.db_url}, logs in {h.logs}")
            try:
                await self.conveyor()
            except Exception as exc:  # start-up problems, not a workload's
                self.failures["conveyor"] = f"{type(exc).__name__}: {exc}"
                self.broken = "conveyor start-up"
                _say(f"!! Conveyor services: {exc}\n{h.tails()}")
            for name in list(h.services):
                h.stop(name)
            await self.celery()
            rss = {name: h.rss.peak_mb(name) for name in ("api", "publisher", "worker")}
            rss["celery"] = (self.details.get("celery") or {}).get("rss_mb")
        finally:
            await h.close()
        params = {**asdict(o), "output": str(o.output), "skip": sorted(o.skip)}
        params["backfill_rows"] = o.backfill_rows if o.with_backfill else None
        details = {k: v for k, v in self.details.items() if v is not None}
        return report.summary(params, machine, details, rss, self.failures)


def _drop_since(result: dict[str, Any] | None) -> dict[str, Any] | None:
    if result is not None:
        result.pop("since", None)
    return result


def _brief(result: Any) -> str:
    if isinstance(result, tuple):
        result = result[0]
    if not isinstance(result, dict):
        return "done"
    keys = ("jobs_per_s", "msgs_per_s", "p50", "p99", "seconds", "submit_jobs_per_s",
            "drain_jobs_per_s")  # fmt: skip
    return ", ".join(f"{k}={result[k]}" for k in keys if k in result)


def parse(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="N=3000, 10 s of latency: under two minutes")  # fmt: skip
    p.add_argument("--n", type=int, help="jobs per throughput workload (20000; quick 3000)")
    p.add_argument(
        "--rest-n", type=int, help="jobs of the REST workload (N; full mode at most 10000)"
    )
    p.add_argument("--latency-seconds", type=float, help="latency run length (30; quick 10)")
    p.add_argument("--latency-rate", type=float, default=100.0, help="jobs/s (100)")
    p.add_argument("--connections", type=int, default=32, help="REST connections (32)")
    p.add_argument("--client-procs", type=int, default=1,
                   help="REST load-generator processes sharing the connections (1)")  # fmt: skip
    p.add_argument("--api-workers", type=int, default=1,
                   help="`conveyor api --workers N`: API processes on one port (1)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--batch-connections", type=int, default=2,
                   help="batch requests in flight (2)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=128,
                   help="conveyor worker --concurrency; also Celery's prefetch (128)")  # fmt: skip
    p.add_argument("--celery-pool", action="append", choices=list(workloads.CELERY_POOLS),
                   help="a Celery configuration to try (repeatable; all three by default: solo, "
                   "prefork with 2 processes, threads; the fastest is compared)")  # fmt: skip
    p.add_argument("--with-backfill", action="store_true",
                   help="then the batch workload before and after --backfill-rows jobs are "
                   "generated in the table (batch_jobs_per_s_backfill, "
                   "batch_backfill_vs_empty)")  # fmt: skip
    p.add_argument("--backfill-rows", type=int, default=10_000_000,
                   help="jobs generated for the large-table step (10,000,000)")  # fmt: skip
    p.add_argument("--backfill-repeat", type=int, default=3,
                   help="batch runs before and after the backfill; medians compared "
                   "(3)")  # fmt: skip
    p.add_argument("--http-client", choices=["raw", "httpx"], default="raw",
                   help="the load generator's HTTP client (raw; see bench/README.md)")  # fmt: skip
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each rest/batch/latency/Celery workload; the best is reported "
                   "(1; on a shared machine 3 gives steadier numbers)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds before a workload counts as failed (300)")  # fmt: skip
    p.add_argument("--skip", action="append", default=[], choices=STEPS,
                   help="leave a workload out (repeatable; for development)")  # fmt: skip
    p.add_argument("--profile", action="store_true",
                   help="py-spy the services during each workload (pip install py-spy); "
                   "slows them down")  # fmt: skip
    p.add_argument("--output", type=Path, default=RESULTS / "latest.json")
    a = p.parse_args(argv)
    n = a.n or (3000 if a.quick else 20_000)
    rest_n = a.rest_n or (n if a.quick else min(n, 10_000))
    return Options(
        quick=a.quick,
        n=n,
        rest_n=rest_n,
        latency_seconds=a.latency_seconds or (10.0 if a.quick else 30.0),
        latency_rate=a.latency_rate,
        connections=a.connections,
        client_procs=a.client_procs,
        batch_size=a.batch_size,
        batch_connections=a.batch_connections,
        concurrency=a.concurrency,
        celery_pools=a.celery_pool or list(workloads.CELERY_POOLS),
        with_backfill=a.with_backfill,
        backfill_rows=a.backfill_rows,
        backfill_repeat=max(1, a.backfill_repeat),
        timeout=a.timeout,
        http_client=a.http_client,
        profile=a.profile,
        repeat=max(1, a.repeat),
        database_url=os.environ.get(
            "CONVEYOR_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/conveyor"
        ),
        amqp_url=os.environ.get("CONVEYOR_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
        output=a.output,
        skip=set(a.skip),
        api_workers=max(1, a.api_workers),
    )


async def main(opts: Options) -> int:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    data = await Runner(opts).run()
    report.write(data, opts.output)
    print(report.table(data))
    print()
    print(f"CPU milliseconds per job, by process ({os.cpu_count()} CPUs; `other`: CPUs used by "
          "processes outside the benchmark):")  # fmt: skip
    print(report.cpu_table(data["details"]))
    print(f"\nwrote {opts.output}")
    if (data["noise_cpus"] or 0) > 0.2:
        print(f"WARNING: other processes used {data['noise_cpus']} of {os.cpu_count()} CPUs on "
              "average during the workloads (column `other`); these numbers understate Conveyor "
              "and Celery alike. Run again on a quiet machine.")  # fmt: skip
    if data["failures"]:
        print("failures:\n" + "\n".join(f"  {k}: {v}" for k, v in data["failures"].items()))
        return 1
    return 0


def run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a Conveyor dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    try:
        sys.exit(run(main(parse())))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: every benchmark process was stopped", file=sys.stderr)
        sys.exit(130)
