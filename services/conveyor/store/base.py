"""What every entity module of the store shares: the connection protocol and the rendered
statements of one schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Connection(Protocol):
    """The slice of ``asyncpg.Connection`` the store uses (a pooled connection proxy too)."""

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]: ...
    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any: ...
    async def fetchval(self, query: str, *args: Any, timeout: float | None = None) -> Any: ...
    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str: ...


# A long statement's own limit (see ``LongStatements``).
LONG_STATEMENT_TIMEOUT = 300.0


class LongStatements:
    """A connection whose statements carry ``LONG_STATEMENT_TIMEOUT`` instead of the pool's
    command timeout: the API's batch and workflow inserts, which may legitimately run for seconds
    while a liveness probe answers for the server (``api/liveness.py``)."""

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

    def transaction(self) -> Any:
        return self.conn.transaction()

    def is_in_transaction(self) -> bool:
        return bool(self.conn.is_in_transaction())


class Statements:
    """The typed base of ``Store``: the statements rendered for one schema. Each module of the
    store adds its methods in a subclass (``JobStatements``, ...); ``Store`` combines them."""

    schema: str
    sql: Mapping[str, str]


def affected(status: str) -> int:
    """The row count of a command tag such as ``DELETE 12``."""
    return int(status.split()[-1])
