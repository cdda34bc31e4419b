"""The per-key submit quota (``CONVEYOR_RATE_LIMIT``), fleet-wide: one token bucket per key in
PostgreSQL (``api_rate``), shared by every API process (replicas, ``conveyor api --workers``).

Cheap on the hot path: a process takes a *chunk* of tokens at a time (what the rate allows in
``WINDOW`` seconds, at least one) and admits submits from it locally; it goes back to
PostgreSQL only when its chunk is spent. A key the fleet bucket refused is refused locally,
with no round trip, until ``WINDOW`` has passed. So the table is touched at most once per key
per chunk, and a key hammering past its quota costs one statement per ``WINDOW`` per process.

What a key gets: at most the rate over time, fleet-wide, plus a burst of the bucket's size and
of the chunks processes hold unspent (at most one chunk per process; a chunk unused for
``HOLD`` seconds is dropped, so held tokens never pile up)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .keycache import parse_rate

WINDOW = 0.25  # seconds of the rate in one chunk; how long a refusal is trusted locally
HOLD = 5.0  # seconds a process keeps an unspent chunk

# (who, tokens per second, bucket size, tokens wanted) → (tokens taken, tokens left)
Take = Callable[[str, float, float, int], Awaitable[tuple[int, float]]]


@dataclass(slots=True)
class _Held:
    tokens: int = 0  # taken from the fleet bucket, not yet spent
    taken_at: float = -math.inf
    refused_at: float = -math.inf  # the fleet bucket had nothing (then: ``left`` tokens)
    left: float = 0.0


class FleetRateLimiter:
    def __init__(
        self, spec: str | None, take: Take, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = parse_rate(spec)
        self._take = take
        self.clock = clock
        self.held: dict[str, _Held] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self.round_trips = 0  # statements run, for tests

    @property
    def chunk(self) -> int:
        assert self.rate is not None
        return max(1, math.floor(self.rate[0] * WINDOW))

    async def take(self, who: str) -> int | None:
        """None: admitted. Else the whole seconds to wait (``Retry-After``)."""
        if self.rate is None:
            return None
        while True:
            h = self.held.setdefault(who, _Held())
            now = self.clock()
            if h.tokens and now - h.taken_at > HOLD:
                h.tokens = 0
            if h.tokens:
                h.tokens -= 1
                return None
            if now - h.refused_at < WINDOW:
                return self._wait(h.left)
            fut = self._inflight.get(who)
            if fut is None:  # one statement per key in flight; the others wait for it
                fut = asyncio.ensure_future(self._refill(who, h))
                self._inflight[who] = fut
                fut.add_done_callback(lambda _: self._inflight.pop(who, None))
            await asyncio.shield(fut)

    async def _refill(self, who: str, h: _Held) -> None:
        assert self.rate is not None
        per_second, size = self.rate
        self.round_trips += 1
        taken, left = await self._take(who, per_second, size, self.chunk)
        now = self.clock()
        if taken:
            h.tokens, h.taken_at = h.tokens + taken, now
        else:
            h.refused_at, h.left = now, left
        if len(self.held) > 10_000:  # keys come from the key table, but stay bounded
            self.held = {k: v for k, v in self.held.items() if v.tokens or k == who}

    def _wait(self, left: float) -> int:
        assert self.rate is not None
        return max(1, math.ceil((1 - left) / self.rate[0]))
