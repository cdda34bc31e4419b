"""Every connection kind the docs promise, through every library call that takes one: asyncpg
connections, SQLAlchemy ``AsyncSession`` and ``AsyncConnection`` (asyncpg driver) for
``enqueue()``, ``enqueue_workflow()`` and ``conveyor.testing``; psycopg connections and
SQLAlchemy ``Session`` and ``Connection`` (psycopg driver) for ``conveyor.enqueue_sync``.

Each call is the first statement of the caller's transaction (SQLAlchemy begins the driver's
transaction lazily), and the caller's commit keeps the job while its rollback leaves nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from conveyor import Job, JobRouter, Workflow, enqueue, enqueue_sync, enqueue_workflow
from conveyor.testing import all_enqueued, assert_enqueued, drain, refute_enqueued, register_types

ASYNC_KINDS = ("asyncpg", "AsyncSession", "AsyncConnection")
SYNC_KINDS = ("psycopg", "Session", "Connection")

router = JobRouter()


@router.job("kinds_ok")
async def kinds_ok(job: Job) -> str:
    return "done"


def _workflow() -> Workflow:
    wf = Workflow("kinds")
    wf.add("first", "kinds_ok")
    wf.add("then", "kinds_ok", after=["first"])
    return wf


@contextlib.asynccontextmanager
async def async_caller(kind: str, url: str, *, commit: bool = True) -> AsyncIterator[Any]:
    """``kind``'s connection, in a transaction committed (or rolled back) after the block."""
    if kind == "asyncpg":
        conn = await asyncpg.connect(url)
        try:
            tx = conn.transaction()
            await tx.start()
            yield conn
            await (tx.commit() if commit else tx.rollback())
        finally:
            await conn.close()
        return
    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))
    try:
        if kind == "AsyncSession":
            async with AsyncSession(engine) as session:
                yield session
                await (session.commit() if commit else session.rollback())
        else:
            async with engine.connect() as connection:
                yield connection
                await (connection.commit() if commit else connection.rollback())
    finally:
        await engine.dispose()


@contextlib.contextmanager
def sync_caller(kind: str, url: str, *, commit: bool = True) -> Iterator[Any]:
    """The synchronous ``kind``'s connection, in a transaction committed or rolled back."""
    if kind == "psycopg":
        with psycopg.connect(url) as conn:
            yield conn
            conn.commit() if commit else conn.rollback()
        return
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) if kind == "Session" else engine.connect() as conn:
            yield conn
            conn.commit() if commit else conn.rollback()
    finally:
        engine.dispose()


@pytest.fixture
async def url(db_url: str) -> str:
    conn = await asyncpg.connect(db_url)
    try:
        await register_types(conn, router)
    finally:
        await conn.close()
    return db_url


async def _counts(db: asyncpg.Connection) -> tuple[int, int, int]:
    row = await db.fetchrow("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM job_outbox),"
                            " (SELECT count(*) FROM workflows)")  # fmt: skip
    assert row is not None
    return row[0], row[1], row[2]


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize("kind", ASYNC_KINDS)
async def test_enqueue(url: str, db: asyncpg.Connection, kind: str, commit: bool) -> None:
    async with async_caller(kind, url, commit=commit) as conn:
        await enqueue(conn, "kinds_ok", {"kind": kind})
    assert await _counts(db) == ((1, 1, 0) if commit else (0, 0, 0))


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize("kind", ASYNC_KINDS)
async def test_enqueue_workflow(url: str, db: asyncpg.Connection, kind: str, commit: bool) -> None:
    async with async_caller(kind, url, commit=commit) as conn:
        await enqueue_workflow(conn, _workflow())
    assert await _counts(db) == ((2, 1, 1) if commit else (0, 0, 0))


@pytest.mark.parametrize("kind", ASYNC_KINDS)
async def test_testing_helpers(url: str, db: asyncpg.Connection, kind: str) -> None:
    """What ``docs/testing.md`` shows, on each kind: register, assert, drain; each helper sees
    the transaction's own uncommitted jobs."""
    async with async_caller(kind, url, commit=False) as conn:
        await register_types(conn, router)
        await refute_enqueued(conn, "kinds_ok")
        await enqueue(conn, "kinds_ok", {"n": 1})
        await assert_enqueued(conn, "kinds_ok", payload={"n": 1}, count=1)
        result = await drain(conn, router)
        assert [a.status.value for a in result.attempts] == ["COMPLETED"]
        assert await all_enqueued(conn) == []
    assert await _counts(db) == (0, 0, 0)  # all of it in the rolled back transaction


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_enqueue_sync(url: str, db: asyncpg.Connection, kind: str, commit: bool) -> None:
    calls: list[Callable[[Any], object]] = [
        lambda conn: enqueue_sync.enqueue(conn, "kinds_ok", {"kind": kind}),
        lambda conn: enqueue_sync.enqueue_workflow(conn, _workflow()),
    ]
    for call in calls:

        def go(call: Callable[[Any], object] = call) -> None:
            with sync_caller(kind, url, commit=commit) as conn:
                call(conn)

        await asyncio.to_thread(go)
    assert await _counts(db) == ((3, 2, 1) if commit else (0, 0, 0))


async def test_testing_helpers_on_a_pool(url: str, db: asyncpg.Connection) -> None:
    """``docs/testing.md``: the helpers take an asyncpg pool as well (each call on a
    connection of its own, committed)."""
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        await register_types(pool, router)
        await refute_enqueued(pool, "kinds_ok")
        await enqueue(db, "kinds_ok", {"n": 1})
        await assert_enqueued(pool, "kinds_ok", payload={"n": 1}, count=1)
        result = await drain(pool, router)
        assert [a.status.value for a in result.attempts] == ["COMPLETED"]
        assert await all_enqueued(pool) == []
    finally:
        await pool.close()
