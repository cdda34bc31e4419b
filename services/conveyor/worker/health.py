"""A tiny HTTP endpoint for a worker's probes (no framework: it must answer even when the worker
is busy, and must not answer when the event loop is stuck — which is the point of a liveness
probe).

- ``/healthz`` (liveness): 200 while the event loop turns and the worker's loops are alive and
  its broker connection has not stayed down longer than ``broker_grace``; else 503 so Kubernetes
  restarts a wedged worker. A busy worker (every slot running a long job) is healthy.
- ``/readyz``: 200 while connected and consuming.
- ``/metrics``: Prometheus.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .consumer import Worker


class WorkerHealth:
    def __init__(self, worker: Worker, *, broker_grace: float = 60.0) -> None:
        self.worker = worker
        self.broker_grace = broker_grace
        self._down_since: float | None = None

    def broker_connected(self) -> bool:
        conn = self.worker.connection
        return (
            conn is not None
            and not conn.is_closed
            and self.worker.channel is not None
            and (not self.worker.channel.is_closed)
        )

    def check(self) -> tuple[bool, dict[str, Any]]:
        """Liveness: (healthy, details)."""
        now = time.monotonic()
        connected = self.broker_connected()
        if connected:
            self._down_since = None
        elif self._down_since is None:
            self._down_since = now
        dead_loops = [t.get_name() for t in self.worker._tasks if t.done()]
        broker_down_for = 0.0 if self._down_since is None else now - self._down_since
        healthy = not dead_loops and broker_down_for <= self.broker_grace
        if self.worker._stopping:
            healthy = True  # draining is not wedged
        return healthy, {
            "broker_connected": connected,
            "broker_down_seconds": round(broker_down_for, 1),
            "dead_loops": dead_loops,
            "running": len(self.worker.running),
            "concurrency": self.worker.concurrency,
        }

    def ready(self) -> bool:
        return (
            self.broker_connected()
            and bool(self.worker.consumer_tags)
            and not self.worker._stopping
        )


async def serve_health(
    worker: Worker, host: str, port: int, *, broker_grace: float = 60.0
) -> asyncio.Server:
    health = WorkerHealth(worker, broker_grace=broker_grace)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            path = line.split(b" ")[1].decode() if line.count(b" ") >= 2 else "/"
            if path == "/healthz":
                ok, details = health.check()
                status, body, ctype = (
                    (200 if ok else 503),
                    orjson.dumps(details),
                    "application/json",
                )
            elif path == "/readyz":
                ok = health.ready()
                status, body, ctype = (
                    (200 if ok else 503),
                    orjson.dumps({"ready": ok}),
                    "application/json",
                )
            elif path == "/metrics":
                status, body, ctype = (
                    200,
                    generate_latest(worker.metrics.registry),
                    CONTENT_TYPE_LATEST,
                )
            else:
                status, body, ctype = 404, b'{"error": "not found"}', "application/json"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
