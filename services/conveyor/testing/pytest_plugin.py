"""pytest fixtures for applications' test suites. Enable them in ``conftest.py``::

    pytest_plugins = ["conveyor.testing.pytest_plugin"]

    @pytest.fixture
    def conveyor_router():        # optional: its types are registered for every test
        return my_app.router

- ``conveyor_database_url`` (session): ``CONVEYOR_TEST_DATABASE_URL``, else
  ``CONVEYOR_DATABASE_URL``; the database is created if missing.
- ``conveyor_schema`` (session): a fresh schema migrated to the newest revision
  (``conveyor migrate`` into ``conveyor_test_<random>``), set as ``CONVEYOR_DB_SCHEMA`` for the
  session so ``enqueue`` and the helpers use it; dropped at the end.
- ``conveyor_conn``: an asyncpg connection inside a transaction rolled back after the test,
  with ``conveyor_router``'s types registered: every test starts from empty tables.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from ..jobs.router import JobRouter
from ..store import for_schema
from ..store.connect import connect
from ..store.migrate import migrate
from . import register_types


@pytest.fixture(scope="session")
def conveyor_database_url() -> str:
    url = os.environ.get("CONVEYOR_TEST_DATABASE_URL") or os.environ.get("CONVEYOR_DATABASE_URL")
    if not url:
        pytest.fail(
            "set CONVEYOR_TEST_DATABASE_URL (or CONVEYOR_DATABASE_URL) for Conveyor's "
            "test fixtures",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def conveyor_schema(conveyor_database_url: str) -> Iterator[str]:
    schema = f"conveyor_test_{uuid.uuid4().hex[:12]}"
    migrate(conveyor_database_url, schema=schema)
    before = os.environ.get("CONVEYOR_DB_SCHEMA")
    os.environ["CONVEYOR_DB_SCHEMA"] = schema
    try:
        yield schema
    finally:
        if before is None:
            os.environ.pop("CONVEYOR_DB_SCHEMA", None)
        else:
            os.environ["CONVEYOR_DB_SCHEMA"] = before
        asyncio.run(_drop(conveyor_database_url, schema))


async def _drop(url: str, schema: str) -> None:
    conn = await connect(url)
    try:
        await for_schema(schema).testing_drop_schema(conn)
    finally:
        await conn.close()


@pytest.fixture
def conveyor_router() -> JobRouter | None:
    """Override in your conftest to return your application's router."""
    return None


@pytest_asyncio.fixture
async def conveyor_conn(
    conveyor_database_url: str, conveyor_schema: str, conveyor_router: JobRouter | None
) -> AsyncIterator[Any]:
    conn = await connect(conveyor_database_url)
    tx = conn.transaction()
    await tx.start()
    try:
        if conveyor_router is not None:
            await register_types(conn, conveyor_router, schema=conveyor_schema)
        yield conn
    finally:
        await tx.rollback()
        await conn.close()
