"""Probes of a worker, designed to tell a wedged worker from a busy one.

- liveness (``/healthz``): healthy while the event loop turns (the endpoint answers at all), the
  worker's internal loops (claim, results, heartbeat) are alive, and its broker connection has
  not stayed down longer than ``broker_grace``. A busy worker — every slot running a long job —
  is healthy. Draining is healthy.
- readiness (``/readyz``): connected and consuming.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..core.probes import DownTimer, serve_probes
from .consumer import Worker


class WorkerHealth:
    def __init__(self, worker: Worker, *, broker_grace: float = 60.0) -> None:
        self.worker = worker
        self.broker_grace = broker_grace
        self._down = DownTimer()

    def broker_connected(self) -> bool:
        conn, channel = self.worker.connection, self.worker.channel
        return (
            conn is not None
            and not conn.is_closed
            and channel is not None
            and (not channel.is_closed)
        )

    def check(self) -> tuple[bool, dict[str, Any]]:
        connected = self.broker_connected()
        down_for = self._down.update(connected)
        dead_loops = [t.get_name() for t in self.worker._tasks if t.done()]
        healthy = self.worker._stopping or (not dead_loops and down_for <= self.broker_grace)
        return healthy, {
            "broker_connected": connected,
            "broker_down_seconds": round(down_for, 1),
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
    return await serve_probes(
        host, port, live=health.check, ready=health.ready, registry=worker.metrics.registry
    )
