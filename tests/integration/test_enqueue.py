"""Transactional enqueue joins the caller's transaction: commit → job + outbox row; rollback →
nothing at all. asyncpg connections and SQLAlchemy AsyncSessions alike."""

from __future__ import annotations

import asyncpg
import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from conveyor import JobSpec, enqueue, enqueue_many
from conveyor.core.errors import IdempotencyConflict, InvalidJob


async def _counts(db: asyncpg.Connection) -> tuple[int, int]:
    return (
        await db.fetchval("SELECT count(*) FROM jobs"),
        await db.fetchval("SELECT count(*) FROM job_outbox"),
    )


async def test_enqueue_commits_with_the_callers_transaction(db: asyncpg.Connection) -> None:
    await db.execute("CREATE TABLE orders (id int primary key)")
    async with db.transaction():
        await db.execute("INSERT INTO orders VALUES (1)")
        job_id = await enqueue(db, "send_email", {"to": "a@example.com"}, priority="high")
    row = await db.fetchrow(
        "SELECT status::text, priority, payload::text FROM jobs WHERE id=$1", job_id
    )
    assert row["status"] == "PENDING" and row["priority"] == 9
    assert orjson.loads(row["payload"]) == {"to": "a@example.com"}
    assert await db.fetchval("SELECT job_id FROM job_outbox") == job_id


async def test_rolled_back_transaction_leaves_no_job_and_no_outbox_row(
    db: asyncpg.Connection,
) -> None:
    await db.execute("CREATE TABLE orders (id int primary key)")
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await db.execute("INSERT INTO orders VALUES (1)")
            await enqueue(db, "send_email", {"to": "a@example.com"})
            raise RuntimeError("the order failed")
    assert await _counts(db) == (0, 0)
    assert await db.fetchval("SELECT count(*) FROM orders") == 0


async def test_enqueue_many_and_scheduled_jobs(db: asyncpg.Connection) -> None:
    async with db.transaction():
        ids = await enqueue_many(
            db,
            [JobSpec("a", {"n": 1}), JobSpec("b", {"n": 2}, delay_seconds=3600), JobSpec("c")],
        )
    statuses = {r["id"]: r["status"] for r in await db.fetch("SELECT id, status::text FROM jobs")}
    assert [statuses[i] for i in ids] == ["PENDING", "SCHEDULED", "PENDING"]
    # scheduled jobs get no outbox row until they are due
    assert await db.fetchval("SELECT count(*) FROM job_outbox") == 2


async def test_idempotency_key_in_enqueue(db: asyncpg.Connection) -> None:
    first = await enqueue(db, "t", {"a": 1}, idempotency_key="k1")
    again = await enqueue(db, "t", {"a": 1}, idempotency_key="k1")
    assert first == again
    with pytest.raises(IdempotencyConflict):
        await enqueue(db, "t", {"a": 2}, idempotency_key="k1")
    assert await _counts(db) == (1, 1)


async def test_invalid_job_raises_before_writing(db: asyncpg.Connection) -> None:
    with pytest.raises(InvalidJob):
        async with db.transaction():
            await enqueue(db, "ok", {})
            await enqueue(db, "not ok!", {})
    assert await _counts(db) == (0, 0)


@pytest.mark.parametrize("commit", [True, False])
async def test_sqlalchemy_async_session(db_url: str, db: asyncpg.Connection, commit: bool) -> None:
    engine = create_async_engine(db_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with AsyncSession(engine) as session:
            await session.execute(text("CREATE TABLE IF NOT EXISTS notes (t text)"))
            await session.commit()
            await session.execute(text("INSERT INTO notes VALUES ('x')"))
            job_id = await enqueue(session, "send_email", {"n": 1})
            if commit:
                await session.commit()
            else:
                await session.rollback()
    finally:
        await engine.dispose()
    expected = (1, 1) if commit else (0, 0)
    assert await _counts(db) == expected
    if commit:
        assert await db.fetchval("SELECT id FROM jobs") == job_id


async def test_enqueue_inside_a_traced_request_stores_the_callers_span(
    db: asyncpg.Connection,
) -> None:
    """Tracing: an application that traces calls ``enqueue()`` inside its span; the
    job joins that trace (its attempts become children), even with Conveyor's tracing off."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("app")
    with tracer.start_as_current_span("checkout") as span:
        traced = await enqueue(db, "send_email", {"to": "a@example.com"})
    untraced = await enqueue(db, "send_email", {"to": "b@example.com"})
    c = span.get_span_context()
    rows = dict(await db.fetch("SELECT id, trace_context FROM jobs"))
    assert rows == {
        traced: f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}",
        untraced: None,
    }


async def test_a_unique_or_meta_job_keeps_the_callers_trace(db: asyncpg.Connection) -> None:
    """Unique and meta jobs take the full insert, which stores the trace context too (else
    trace_context is NULL for both)."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("app")
    with tracer.start_as_current_span("checkout") as span:
        unique = await enqueue(db, "send_email", {"to": "a@example.com"}, unique_for=60)
        with_meta = await enqueue(db, "send_email", {"to": "b@example.com"}, meta={"t": 1})
    c = span.get_span_context()
    want = f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"
    rows = dict(await db.fetch("SELECT id, trace_context FROM jobs"))
    assert rows == {unique: want, with_meta: want}


async def test_a_non_finite_number_raises_before_writing(db: asyncpg.Connection) -> None:
    """``float('nan')`` in a payload would be stored as ``null`` (orjson): refused, like the API
    refuses it, and nothing of the caller's transaction's jobs is written."""
    with pytest.raises(InvalidJob, match=r"numbers must be finite \(nan at payload\.score\)"):
        async with db.transaction():
            await enqueue(db, "ok", {})
            await enqueue(db, "echo", {"score": float("nan")})
    with pytest.raises(InvalidJob, match=r"inf at payload\.xs\[0\]"):
        await enqueue_many(db, [JobSpec("a", {"xs": [float("inf")]})])
    assert await _counts(db) == (0, 0)
