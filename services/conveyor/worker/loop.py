"""Measuring the event loop's lag, so a handler that blocks it is seen.

An ``async def`` handler that blocks (``time.sleep``, a synchronous client) stops everything on
the worker's loop: heartbeats, claims, outcome writes, and an HTTP probe served on that loop. The
monitor's task wakes every ``interval`` and notes the time; ``blocked_for()`` — callable from any
thread, such as the probe thread — says how long the loop has not turned. Each tick also records
the lag (how late the wake-up was) in ``conveyor_worker_loop_lag_seconds`` and its maximum since
start in ``conveyor_worker_loop_lag_max_seconds`` and calls ``on_tick`` (the worker refreshes
the status snapshot the probe thread reads).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge


@dataclass(frozen=True, slots=True)
class LoopStatus:
    lag_seconds: float  # how late the last wake-up was
    max_lag_seconds: float
    last_tick_at: float  # clock time of the last wake-up


class LoopMonitor:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        interval: float = 0.25,
        on_tick: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.on_tick = on_tick
        self.clock = clock
        self.lag = 0.0
        self.max_lag = 0.0
        self.last_tick_at = clock()
        lag = Gauge(
            "conveyor_worker_loop_lag_seconds",
            "How late the worker's event loop woke up last (blocked by a handler?)",
            registry=registry,
        )
        lag.set_function(lambda: max(self.lag, self.blocked_for()))
        top = Gauge(
            "conveyor_worker_loop_lag_max_seconds",
            "The longest the worker's event loop was blocked since start",
            registry=registry,
        )
        top.set_function(lambda: max(self.max_lag, self.blocked_for()))

    def status(self) -> LoopStatus:
        return LoopStatus(self.lag, self.max_lag, self.last_tick_at)

    def blocked_for(self) -> float:
        """Seconds since the loop last turned, beyond the monitor's own interval (any thread)."""
        return max(0.0, self.clock() - self.last_tick_at - self.interval)

    def tick(self, expected: float) -> float:
        """One step: the loop woke up (it meant to at ``expected``); returns the lag."""
        now = self.clock()
        self.lag = max(0.0, now - expected)
        self.max_lag = max(self.max_lag, self.lag)
        self.last_tick_at = now
        if self.on_tick is not None:
            self.on_tick()
        return self.lag

    async def run(self) -> None:
        while True:
            expected = self.clock() + self.interval
            await asyncio.sleep(self.interval)
            self.tick(expected)
