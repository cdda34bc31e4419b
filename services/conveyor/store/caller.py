"""The caller's side of the database for library calls (``enqueue()``, ``conveyor.testing``,
registering a router): the asyncpg connection behind what the caller holds, inside the caller's
transaction, and the store of the schema it names."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from . import Store, for_schema
from .schema import DEFAULT_SCHEMA

WRONG_KIND = "enqueue needs an asyncpg connection or a SQLAlchemy AsyncSession/AsyncConnection"


def schema_store(schema: str | None = None) -> Store:
    """The statements of ``schema``, else ``CONVEYOR_DB_SCHEMA``, else ``conveyor``. Every
    statement names the schema: the caller's connection keeps its own search_path."""
    return for_schema(schema or os.environ.get("CONVEYOR_DB_SCHEMA") or DEFAULT_SCHEMA)


async def asyncpg_connection(conn: Any) -> Any:
    """The asyncpg connection behind ``conn``: an asyncpg connection (or a pooled one) as it is;
    a SQLAlchemy ``AsyncSession`` or ``AsyncConnection`` on asyncpg with its transaction begun,
    down to the driver, so that what runs on the driver commits or rolls back with it."""
    if hasattr(conn, "fetch") and hasattr(conn, "transaction"):
        return conn  # asyncpg.Connection or a pool's connection proxy
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession  # loaded for its callers only

    if isinstance(conn, AsyncSession):
        sa_conn = await conn.connection()  # begins the session's transaction
    elif isinstance(conn, AsyncConnection):
        sa_conn = conn
        if not sa_conn.in_transaction():
            await sa_conn.begin()  # what autobegin would do at the caller's next statement
    else:
        raise TypeError(WRONG_KIND)
    raw = await sa_conn.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, asyncpg.Connection):
        raise TypeError("the SQLAlchemy connection must use the asyncpg driver")
    if not driver.is_in_transaction():
        await schema_store().db_ping_through(sa_conn)
    return driver


@contextlib.asynccontextmanager
async def connection_or_pool(conn: Any) -> AsyncIterator[Any]:
    """For ``conveyor.testing``'s helpers, which take a pool too: a connection of an asyncpg
    pool for the block, else the connection behind ``conn``."""
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as acquired:
            yield acquired
    else:
        yield await asyncpg_connection(conn)
