"""Telling a long statement from an outage: the store's ``LongStatements`` lifts the pool's
command timeout for one statement, ``Liveness`` answers whether the server still responds
meanwhile, and ``unavailable`` builds the (logged) 503 error."""

from __future__ import annotations

import asyncio
import logging

from ..core.errors import ServiceUnavailable
from ..core.logging import event
from ..store import Store

log = logging.getLogger("conveyor.api")

PROBE_EVERY = 0.3


def unavailable(cause: str, exc: BaseException | None = None) -> ServiceUnavailable:
    """The 503 error, logged with its cause."""
    event(log, "api_unavailable", logging.WARNING, cause=cause,
          error=repr(exc)[:300] if exc is not None else None)  # fmt: skip
    return ServiceUnavailable("database unavailable")


class Liveness:
    """Is the server answering? The store's ping on a dedicated connection, at most one probe at
    a time, a success remembered for ``PROBE_EVERY``."""

    def __init__(self, store: Store, url: str, timeout: float) -> None:
        self.probe = store.server_ping(url)
        self.timeout = timeout
        self.lock = asyncio.Lock()
        self.ok_at = -1.0

    async def alive(self) -> bool:
        loop = asyncio.get_running_loop()
        async with self.lock:
            if loop.time() - self.ok_at < PROBE_EVERY:
                return True
            try:
                async with asyncio.timeout(self.timeout):
                    await self.probe.ping()
            except Exception:
                await self.close()
                return False
            self.ok_at = loop.time()
            return True

    async def close(self) -> None:
        self.probe.close()
