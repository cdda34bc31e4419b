"""The caller's side of the database for library calls (``enqueue()``, ``conveyor.testing``,
registering a router): the asyncpg connection behind what the caller holds, and the store of the
schema it names."""

from __future__ import annotations

import os
from typing import Any

from ..store import Store, for_schema
from ..store.schema import DEFAULT_SCHEMA


def schema_store(schema: str | None = None) -> Store:
    """The statements of ``schema``, else ``CONVEYOR_DB_SCHEMA``, else ``conveyor``. Every
    statement names the schema: the caller's connection keeps its own search_path."""
    return for_schema(schema or os.environ.get("CONVEYOR_DB_SCHEMA") or DEFAULT_SCHEMA)


async def asyncpg_connection(conn: Any) -> Any:
    """The asyncpg connection behind ``conn`` (asyncpg, SQLAlchemy AsyncSession/AsyncConnection)."""
    if hasattr(conn, "fetch") and hasattr(conn, "transaction"):
        return conn  # asyncpg.Connection or a pool proxy
    connection = getattr(conn, "connection", None)
    if connection is not None and callable(connection):  # AsyncSession.connection()
        sa_conn = await conn.connection()
    else:
        sa_conn = conn
    get_raw = getattr(sa_conn, "get_raw_connection", None)
    if get_raw is None:
        raise TypeError(
            "enqueue needs an asyncpg connection or a SQLAlchemy AsyncSession/AsyncConnection"
        )
    raw = await get_raw()
    driver = getattr(raw, "driver_connection", None)
    if driver is None or not hasattr(driver, "fetch"):
        raise TypeError("the SQLAlchemy connection must use the asyncpg driver")
    return driver
