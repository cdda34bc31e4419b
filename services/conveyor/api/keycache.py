"""The API's view of the keys table and its per-key quota, both cheap on the hot path.

``KeyCache``: a key's row (or its absence) is trusted for ``ttl`` seconds (``CONVEYOR_AUTH_
CACHE_SECONDS``, at most 5), so a request costs a regex, a SHA-256 and a dict lookup; PostgreSQL
is read once per key per ``ttl`` by one request while the others wait for it (single flight).
A revocation therefore takes effect on every replica within ``ttl`` seconds.

``parse_rate``: ``CONVEYOR_RATE_LIMIT`` (``50/s``), the per-key submit quota that
``ratelimit.FleetRateLimiter`` enforces fleet-wide."""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import Callable
from typing import Any

from ..core.apikeys import digest, key_id_of
from ..store import ApiKeyRow

# rows kept at most; beyond, expired entries go first, then everything (misses of random ids
# must not grow the process)
MAX_ENTRIES = 10_000
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smh])\s*$")
_WINDOW = {"s": 1.0, "m": 60.0, "h": 3600.0}


class KeyCache:
    def __init__(self, api: Any, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.ttl = ttl
        self.clock = clock
        self.rows: dict[str, tuple[float, ApiKeyRow | None]] = {}
        self.inflight: dict[str, asyncio.Future[ApiKeyRow | None]] = {}
        self.reads = 0  # PostgreSQL round trips, for tests

    async def row(self, key_id: str) -> ApiKeyRow | None:
        hit = self.rows.get(key_id)
        if hit is not None and hit[0] > self.clock():
            return hit[1]
        fut = self.inflight.get(key_id)
        if fut is None:
            fut = asyncio.ensure_future(self._load(key_id))
            self.inflight[key_id] = fut
            fut.add_done_callback(lambda _: self.inflight.pop(key_id, None))
        return await asyncio.shield(fut)

    async def _load(self, key_id: str) -> ApiKeyRow | None:
        self.reads += 1
        async with self.api.connection() as conn:
            row: ApiKeyRow | None = await self.api.store.api_key_get(conn, key_id)
        now = self.clock()
        if len(self.rows) >= MAX_ENTRIES:
            self.rows = {k: v for k, v in self.rows.items() if v[0] > now}
            if len(self.rows) >= MAX_ENTRIES:
                self.rows.clear()
        self.rows[key_id] = (now + self.ttl, row)
        return row

    async def verify(self, key: str) -> ApiKeyRow | None:
        """The active key's row, or None (malformed, unknown, revoked or wrong secret)."""
        key_id = key_id_of(key)
        if key_id is None:
            return None
        row = await self.row(key_id)
        if row is None or row.revoked_at is not None:
            return None
        return row if hmac.compare_digest(row.key_hash, digest(key)) else None


def parse_rate(spec: str | None) -> tuple[float, float] | None:
    """``"50/s"`` → (tokens per second, bucket size); None: no limit."""
    if not spec:
        return None
    m = _RATE.match(spec)
    if m is None:
        raise ValueError(f"rate limit must look like 50/s, 600/m or 1000/h, got {spec!r}")
    n, window = float(m.group(1)), _WINDOW[m.group(2)]
    if n <= 0:
        raise ValueError("a rate limit must be positive")
    return n / window, max(1.0, n)
