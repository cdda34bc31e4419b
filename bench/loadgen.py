"""The HTTP load generator, run as its own process so the harness can run several of them and
measure their CPU: ``python -m bench.loadgen --url URL --mode rest --n 1000 --connections 32``.

Protocol with the harness: it opens its connections, prints ``ready``, waits for a line on
stdin (the start signal), submits, and prints one JSON line of statistics.

Modes:
- ``rest``: ``n`` jobs, one per ``POST /jobs``, ``connections`` requests in flight.
- ``batch``: ``n`` jobs through ``POST /jobs/batch`` of ``batch_size``, ``connections`` at once.
- ``paced``: ``n`` jobs, one per ``POST /jobs``, started at ``rate`` per second (open loop: a
  slow response does not delay the next submit).

Clients: ``raw`` (default) is a minimal HTTP/1.1 keep-alive client on asyncio streams, a few
microseconds of CPU per request. ``httpx`` is ``httpx.AsyncClient``; on a small machine it is
the bottleneck of the REST workload (see bench/README.md), so it is kept only for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson

JOB = {"type": "noop", "payload": {}}


class Client(Protocol):
    async def post(self, path: str, body: bytes) -> tuple[int, bytes]: ...
    async def get(self, path: str) -> tuple[int, bytes]: ...
    async def close(self) -> None: ...


class RawConnection:
    """One keep-alive HTTP/1.1 connection; reconnects after an error or ``Connection: close``."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        try:
            self.writer.write(head.encode() + body)
            raw = await self.reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip().lower()
            if "content-length" in headers:
                data = await self.reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding") == "chunked":
                data = await self._chunked()
            else:
                data = await self.reader.read()
                headers["connection"] = "close"
        except BaseException:
            self.close()
            raise
        if headers.get("connection") == "close":
            self.close()
        return status, data

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return b"".join(parts)
            parts.append(chunk[:-2])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class RawClient:
    """A fixed pool of ``RawConnection``: a request waits for a free connection."""

    def __init__(self, url: str, connections: int) -> None:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        self.free: asyncio.Queue[RawConnection] = asyncio.Queue()
        for _ in range(connections):
            self.free.put_nowait(RawConnection(host, port))

    async def _request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        conn = await self.free.get()
        try:
            return await conn.request(method, path, body)
        finally:
            self.free.put_nowait(conn)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self._request("POST", path, body)

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self._request("GET", path)

    async def close(self) -> None:
        while not self.free.empty():
            self.free.get_nowait().close()


class HttpxClient:
    def __init__(self, url: str, connections: int, timeout: float) -> None:
        import httpx

        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        r = await self.client.post(path, content=body, headers={"content-type": "application/json"})
        return r.status_code, r.content

    async def get(self, path: str) -> tuple[int, bytes]:
        r = await self.client.get(path)
        return r.status_code, r.content

    async def close(self) -> None:
        await self.client.aclose()


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


async def _post(
    client: Client, path: str, body: bytes, jobs: int, s: Stats, timeout: float
) -> None:
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            status, data = await client.post(path, body)
    except Exception as exc:  # refused, reset, timed out, malformed: all count as failed
        s.error(f"{path}: {exc!r}")
        return
    s.response_ms.append((time.perf_counter() - start) * 1000)
    if status == 201:
        s.accepted += jobs
    else:
        s.error(f"{path}: HTTP {status} {data[:200]!r}")


def _batch_body(k: int) -> bytes:
    return orjson.dumps({"jobs": [JOB] * k})


async def closed_loop(
    client: Client, path: str, per_request: int, n: int, lanes: int, timeout: float
) -> Stats:
    """``n`` jobs in requests of ``per_request`` (1: ``POST /jobs``), ``lanes`` in flight."""
    stats = Stats()
    sizes = [per_request] * (n // per_request) + ([n % per_request] if n % per_request else [])
    bodies = {k: orjson.dumps(JOB) if path == "/jobs" else _batch_body(k) for k in set(sizes)}
    todo = iter(sizes)

    async def lane() -> None:
        for k in todo:  # the iterator is shared: each request is taken exactly once
            await _post(client, path, bodies[k], k, stats, timeout)

    await asyncio.gather(*(lane() for _ in range(lanes)))
    return stats


async def open_loop(client: Client, n: int, rate: float, timeout: float) -> Stats:
    stats = Stats()
    body = orjson.dumps(JOB)
    start = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_post(client, "/jobs", body, 1, stats, timeout)))
    await asyncio.gather(*tasks)
    return stats


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def main(args: argparse.Namespace) -> int:
    client: Client
    if args.client == "httpx":
        client = HttpxClient(args.url, args.connections, args.request_timeout)
    else:
        client = RawClient(args.url, args.connections)
    try:
        # open every connection before the clock starts
        for status, _ in await asyncio.gather(
            *(client.get("/healthz") for _ in range(args.connections))
        ):
            if status != 200:
                raise SystemExit(f"GET /healthz answered {status}")
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        wall, cpu = time.perf_counter(), time.process_time()
        t = args.request_timeout
        if args.mode == "rest":
            stats = await closed_loop(client, "/jobs", 1, args.n, args.connections, t)
        elif args.mode == "batch":
            stats = await closed_loop(
                client, "/jobs/batch", args.batch_size, args.n, args.connections, t
            )
        else:
            stats = await open_loop(client, args.n, args.rate, t)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await client.close()
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
    p = argparse.ArgumentParser(
        prog="python -m bench.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", required=True)
    p.add_argument("--mode", choices=["rest", "batch", "paced"], required=True)
    p.add_argument("--n", type=int, required=True, help="jobs to submit")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--rate", type=float, default=100.0, help="jobs/s in paced mode")
    p.add_argument("--client", choices=["raw", "httpx"], default="raw")
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
