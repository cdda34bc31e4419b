"""Telling a long statement from an outage: the store's ``LongStatements`` lifts the pool's
command timeout for one statement, ``Liveness`` answers whether the server still responds
meanwhile, ``unavailable`` builds the (logged) 503 error, and ``acquire`` is the API's
connection: outages and an unmigrated schema become handled 503s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from ..core.errors import ServiceUnavailable
from ..core.logging import event
from ..store import Store
from ..store.connect import is_unavailable, is_unmigrated

log = logging.getLogger("conveyor.api")

PROBE_EVERY = 0.3


def unavailable(
    cause: str, exc: BaseException | None = None, detail: str = "database unavailable"
) -> ServiceUnavailable:
    """The 503 error, logged with its cause."""
    event(
        log,
        "api_unavailable",
        logging.WARNING,
        cause=cause,
        error=repr(exc)[:300] if exc is not None else None,
    )
    return ServiceUnavailable(detail)


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


@contextlib.asynccontextmanager
async def acquire(pool: Any, timeout: float, schema: str) -> AsyncIterator[Any]:
    """``Api.connection``: acquire within ``timeout``; an outage, or a schema not migrated, becomes
    a handled 503 (and a broken connection is dropped, not reset)."""
    try:
        async with asyncio.timeout(timeout):
            conn = await pool.acquire()
    except Exception as exc:
        if is_unavailable(exc):
            raise unavailable("acquire", exc) from exc
        raise
    try:
        yield conn
    except BaseException as exc:
        if isinstance(exc, ServiceUnavailable) or is_unavailable(exc):
            # broken, hung or abandoned mid-statement: resetting it would wait for the
            # server, or fail and hide this error behind an InternalClientError, so drop it
            with contextlib.suppress(Exception):  # asyncpg may have released it already
                conn.terminate()
        if is_unavailable(exc):
            # a handled 503: the catch-all handler would answer it too, but Starlette then
            # re-raises, uvicorn logs a traceback and closes the client's keep-alive connection
            raise unavailable("statement", exc) from exc
        if is_unmigrated(exc):
            detail = f"database schema {schema!r} is not migrated: run `conveyor migrate`"
            raise unavailable("unmigrated", exc, detail) from exc
        raise
    finally:
        try:
            await pool.release(conn)
        except Exception as exc:  # broke after the request's last statement: keep the answer
            event(log, "db_connection_dropped", logging.WARNING, error=repr(exc))
