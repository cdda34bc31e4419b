"""The HTTP load generator, run as its own process so the harness can run several of them and
measure their CPU: ``python -m bench.loadgen --url URL --mode rest --n 1000 --connections 32``.

Protocol with the harness: it connects and warms its connection pool, prints ``ready``, waits
for a line on stdin (the start signal), submits, and prints one JSON line of statistics.

Modes:
- ``rest``: ``n`` jobs, one per ``POST /jobs``, from ``connections`` concurrent requests.
- ``batch``: ``n`` jobs through ``POST /jobs/batch`` of ``batch_size``, ``connections`` at once.
- ``paced``: ``n`` jobs, one per ``POST /jobs``, started at ``rate`` per second (open loop: a
  slow response does not delay the next submit).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

JOB = {"type": "noop", "payload": {}}
HEADERS = {"content-type": "application/json"}


@dataclass
class Stats:
    accepted: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    response_ms: list[float] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(text[:300])


async def _post(client: httpx.AsyncClient, path: str, body: bytes, jobs: int, s: Stats) -> None:
    start = time.perf_counter()
    try:
        r = await client.post(path, content=body, headers=HEADERS)
    except httpx.HTTPError as exc:
        s.error(f"{path}: {exc!r}")
        return
    s.response_ms.append((time.perf_counter() - start) * 1000)
    if r.status_code == 201:
        s.accepted += jobs
    else:
        s.error(f"{path}: HTTP {r.status_code} {r.text}")


async def closed_loop(
    client: httpx.AsyncClient, path: str, body: bytes, per_request: int, n: int, conns: int
) -> Stats:
    """``n`` jobs in requests of ``per_request``, ``conns`` requests in flight."""
    stats = Stats()
    requests = [per_request] * (n // per_request) + ([n % per_request] if n % per_request else [])
    bodies = {k: body if k == per_request else _batch_body(k) for k in set(requests)}
    queue = iter(requests)

    async def lane() -> None:
        for k in queue:  # the iterator is shared: each request is taken exactly once
            await _post(client, path, bodies[k], k, stats)

    await asyncio.gather(*(lane() for _ in range(conns)))
    return stats


async def open_loop(client: httpx.AsyncClient, n: int, rate: float) -> Stats:
    stats = Stats()
    body = orjson.dumps(JOB)
    start = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_post(client, "/jobs", body, 1, stats)))
    await asyncio.gather(*tasks)
    return stats


def _batch_body(k: int) -> bytes:
    return orjson.dumps({"jobs": [JOB] * k})


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def main(args: argparse.Namespace) -> int:
    limits = httpx.Limits(max_connections=args.connections, max_keepalive_connections=args.connections)
    timeout = httpx.Timeout(args.request_timeout)
    async with httpx.AsyncClient(base_url=args.url, limits=limits, timeout=timeout) as client:
        # open every connection of the pool before the clock starts
        await asyncio.gather(*(client.get("/healthz") for _ in range(args.connections)))
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline)
        wall, cpu = time.perf_counter(), time.process_time()
        if args.mode == "rest":
            stats = await closed_loop(client, "/jobs", orjson.dumps(JOB), 1, args.n, args.connections)
        elif args.mode == "batch":
            body = _batch_body(args.batch_size)
            stats = await closed_loop(
                client, "/jobs/batch", body, args.batch_size, args.n, args.connections
            )
        else:
            stats = await open_loop(client, args.n, args.rate)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    report: dict[str, Any] = {
        "accepted": stats.accepted,
        "errors": stats.errors,
        "error_samples": stats.error_samples,
        "requests": len(stats.response_ms),
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "response_ms_p50": _percentile(stats.response_ms, 0.50),
        "response_ms_p99": _percentile(stats.response_ms, 0.99),
    }
    print(orjson.dumps(report).decode(), flush=True)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--mode", choices=["rest", "batch", "paced"], required=True)
    p.add_argument("--n", type=int, required=True, help="jobs to submit")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--rate", type=float, default=100.0, help="jobs/s in paced mode")
    p.add_argument("--request-timeout", type=float, default=30.0)
    return p.parse_args(argv)


def run(coro: Any) -> Any:
    """``uvloop.run`` when uvloop is installed, else ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a Conveyor dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    sys.exit(run(main(parse())))
