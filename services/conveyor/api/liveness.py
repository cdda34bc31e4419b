"""Telling a long statement from an outage: ``LongStatements`` lifts the pool's command timeout
for one statement, ``Liveness`` answers whether the server still responds meanwhile, and
``unavailable`` builds the (logged) 503 error."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from ..core.errors import ServiceUnavailable
from ..core.logging import event

log = logging.getLogger("conveyor.api")

# A long statement's own limit (the liveness probe answers for the server meanwhile).
LONG_STATEMENT_TIMEOUT = 300.0
PROBE_EVERY = 0.3


def unavailable(cause: str, exc: BaseException | None = None) -> ServiceUnavailable:
    """The 503 error, logged with its cause."""
    event(log, "api_unavailable", logging.WARNING, cause=cause,
          error=repr(exc)[:300] if exc is not None else None)  # fmt: skip
    return ServiceUnavailable("database unavailable")


class LongStatements:
    """A connection whose statements carry ``LONG_STATEMENT_TIMEOUT`` instead of the pool's
    command timeout (the store's ``Connection`` protocol)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]:
        return list(await self.conn.fetch(query, *args, timeout=LONG_STATEMENT_TIMEOUT))

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        return await self.conn.fetchrow(query, *args, timeout=LONG_STATEMENT_TIMEOUT)

    async def fetchval(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        return await self.conn.fetchval(query, *args, timeout=LONG_STATEMENT_TIMEOUT)

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        return str(await self.conn.execute(query, *args, timeout=LONG_STATEMENT_TIMEOUT))


class Liveness:
    """Is the server answering? ``SELECT 1`` on a dedicated connection, at most one probe at a
    time, a success remembered for ``PROBE_EVERY``."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self.conn: Any = None
        self.lock = asyncio.Lock()
        self.ok_at = -1.0

    async def alive(self) -> bool:
        loop = asyncio.get_running_loop()
        async with self.lock:
            if loop.time() - self.ok_at < PROBE_EVERY:
                return True
            try:
                async with asyncio.timeout(self.timeout):
                    if self.conn is None or self.conn.is_closed():
                        # no statement cache: one SELECT 1, through PgBouncer too
                        self.conn = await asyncpg.connect(self.url, statement_cache_size=0)
                    await self.conn.fetchval("SELECT 1")
            except Exception:
                await self.close()
                return False
            self.ok_at = loop.time()
            return True

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.terminate()
            self.conn = None
