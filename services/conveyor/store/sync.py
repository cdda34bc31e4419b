"""The store's statements on a synchronous psycopg (3) connection, for ``enqueue_sync``.

``SyncConnection`` offers the async ``Connection`` protocol over a psycopg connection: each
method runs its statement at once, so a coroutine of store calls never suspends and
``run_sync`` completes it in one step. The same statements (and the same ``enqueue`` code) run
on asyncpg and psycopg; the placeholders ``$1`` become psycopg's ``%(p1)s``."""

from __future__ import annotations

import functools
import re
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

T = TypeVar("T")
_PLACEHOLDER = re.compile(r"\$(\d+)")


@functools.lru_cache(maxsize=256)
def to_psycopg(query: str) -> str:
    return _PLACEHOLDER.sub(r"%(p\1)s", query.replace("%", "%%"))


class SyncConnection:
    """A psycopg connection (the caller's, in the caller's transaction)."""

    def __init__(self, conn: Any) -> None:
        from psycopg.rows import dict_row

        self.conn = conn
        self._rows = dict_row
        info = conn.info
        # what the known-types cache keys on (``jobs.types._database_of``)
        self._addr = (info.host, info.port)
        self._params = SimpleNamespace(database=info.dbname)

    def _run(self, query: str, args: tuple[Any, ...]) -> Any:
        cur = self.conn.cursor(row_factory=self._rows)
        cur.execute(to_psycopg(query), {f"p{i}": a for i, a in enumerate(args, 1)})
        return cur

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]:
        with self._run(query, args) as cur:
            return cur.fetchall() if cur.description else []

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        with self._run(query, args) as cur:
            return cur.fetchone() if cur.description else None

    async def fetchval(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        with self._run(query, args) as cur:
            row = cur.fetchone() if cur.description else None
            return None if row is None else next(iter(row.values()))

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        with self._run(query, args) as cur:
            return str(cur.statusmessage or "")

    def transaction(self) -> Any:
        raise TypeError("enqueue joins the caller's transaction; it never opens one")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Complete a coroutine that never suspends (store calls on a ``SyncConnection``)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a store call suspended on a synchronous connection")
