"""Readiness: is the database reachable, and is the schema at the migration head."""

from __future__ import annotations

from typing import Any

import asyncpg

from .base import Connection, Statements
from .registry import named

DB_PING = named("db_ping")
SCHEMA_VERSION = named("schema_version")

# Revision of the newest migration in ``migrations/versions`` (a test checks they agree).
HEAD = "0001"


class ServerPing:
    """``SELECT 1`` on a connection of its own, opened on first use and dropped after a failure:
    does the server answer while the pool's connections are busy (``api/liveness.py``)."""

    def __init__(self, url: str, sql: str) -> None:
        self.url = url
        self.sql = sql
        self.conn: Any = None

    async def ping(self) -> None:
        if self.conn is None or self.conn.is_closed():
            self.conn = await asyncpg.connect(self.url, statement_cache_size=0)  # PgBouncer too
        await self.conn.fetchval(self.sql)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.terminate()
            self.conn = None


class ProbeStatements(Statements):
    def server_ping(self, url: str) -> ServerPing:
        return ServerPing(url, self.sql[DB_PING])

    async def db_ping(self, conn: Connection, *, timeout: float | None = None) -> None:
        await conn.fetchval(self.sql[DB_PING], timeout=timeout)

    async def db_ping_through(self, sa_conn: Any) -> None:
        """``SELECT 1`` through a SQLAlchemy ``AsyncConnection`` rather than on its driver's
        connection: SQLAlchemy's asyncpg adapter begins the driver's transaction at its own
        first statement, and what runs on the driver before that would commit on its own."""
        await sa_conn.exec_driver_sql(self.sql[DB_PING])

    async def schema_version(self, conn: Connection, *, timeout: float | None = None) -> str | None:
        """The migration revision of this schema, or None when it was never migrated (call it
        outside a transaction: the missing table aborts one)."""
        try:
            value = await conn.fetchval(self.sql[SCHEMA_VERSION], timeout=timeout)
        except (
            asyncpg.exceptions.UndefinedTableError,
            asyncpg.exceptions.InvalidSchemaNameError,
        ):
            return None
        return None if value is None else str(value)

    async def schema_ready(self, conn: Connection, *, timeout: float | None = None) -> bool:
        """True when the schema is at the migration head this code was written for, or later
        (a newer release migrated it during a rolling deploy)."""
        version = await self.schema_version(conn, timeout=timeout)
        return version is not None and version >= HEAD
