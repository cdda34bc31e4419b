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


class Statements:
    """Holds the statements rendered for one schema; entity modules add the functions."""

    schema: str
    sql: Mapping[str, str]


def affected(status: str) -> int:
    """The row count of a command tag such as ``DELETE 12``."""
    return int(status.split()[-1])
