"""``conveyor.enqueue_sync``: the caller's psycopg (3) connection or synchronous SQLAlchemy
Session; commit → job + outbox row, rollback → nothing; the options of ``enqueue`` (unique jobs,
meta, idempotency keys, bounded types) behave the same."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from conveyor import JobSpec
from conveyor.core.errors import IdempotencyConflict, InvalidJob, UnknownJobType
from conveyor.enqueue_sync import enqueue, enqueue_many


def _counts(conn: psycopg.Connection) -> tuple[int, int]:
    with conn.cursor() as cur:
        cur.execute("SELECT (SELECT count(*) FROM conveyor.jobs), "
                    "(SELECT count(*) FROM conveyor.job_outbox)")  # fmt: skip
        row = cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_psycopg_commit_and_rollback(db_url: str) -> None:
    def go() -> None:
        with psycopg.connect(db_url) as conn:
            conn.execute("CREATE TABLE orders (id int primary key)")
            conn.commit()
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (1)")
                job_id = enqueue(conn, "send_email", {"to": "a@example.com"}, priority="high",
                                 meta={"order": 1})  # fmt: skip
            row = conn.execute(
                "SELECT status::text, priority, payload::text, meta::text FROM conveyor.jobs "
                "WHERE id = %s", (job_id,),
            ).fetchone()  # fmt: skip
            assert row is not None and row[:2] == ("PENDING", 9)
            assert orjson.loads(row[2]) == {"to": "a@example.com"}
            assert orjson.loads(row[3]) == {"order": 1}
            assert _counts(conn) == (1, 1)
            with pytest.raises(RuntimeError), conn.transaction():
                conn.execute("INSERT INTO orders VALUES (2)")
                enqueue(conn, "send_email", {"to": "b@example.com"})
                raise RuntimeError("the order failed")
            assert _counts(conn) == (1, 1)
            # every option: scheduled jobs, many at once, idempotency, unique, errors
            later = datetime.now(UTC) + timedelta(hours=1)
            with conn.transaction():
                ids = enqueue_many(conn, [JobSpec("t", {"i": i}, run_at=later) for i in range(3)])
                k1 = enqueue(conn, "t", {"x": 1}, idempotency_key="k")
                k2 = enqueue(conn, "t", {"x": 1}, idempotency_key="k")
                u1 = enqueue(conn, "t", {"u": 1}, unique_for=60)
                u2 = enqueue(conn, "t", {"u": 1}, unique_for=60)
            assert len(set(ids)) == 3 and k1 == k2 and u1 == u2
            scheduled = conn.execute(
                "SELECT count(*) FROM conveyor.jobs WHERE status = 'SCHEDULED'"
            ).fetchone()
            assert scheduled == (3,)
            with pytest.raises(IdempotencyConflict):
                enqueue(conn, "t", {"x": 2}, idempotency_key="k")
            conn.rollback()
            with pytest.raises(InvalidJob):
                enqueue(conn, "t", {"bad": float("nan")}, meta={"m": "x" * 9000})
            with pytest.raises(UnknownJobType):
                enqueue(conn, "no_such_type")
            conn.rollback()

    await asyncio.to_thread(go)


async def test_sqlalchemy_session(db_url: str) -> None:
    url = db_url.replace("postgresql://", "postgresql+psycopg://", 1)

    def go() -> list[uuid.UUID]:
        engine = create_engine(url)
        try:
            with Session(engine) as session:
                session.execute(text("CREATE TABLE orders (id int primary key)"))
                session.commit()
                with session.begin():
                    session.execute(text("INSERT INTO orders VALUES (1)"))
                    kept = enqueue(session, "send_email", {"order": 1})
                with pytest.raises(RuntimeError), session.begin():
                    session.execute(text("INSERT INTO orders VALUES (2)"))
                    enqueue(session, "send_email", {"order": 2})
                    raise RuntimeError("rolled back")
                with session.begin():
                    rows = session.execute(
                        text("SELECT id, payload->>'order' FROM conveyor.jobs")
                    ).all()
                    orders = session.execute(text("SELECT count(*) FROM orders")).scalar()
            assert orders == 1
            assert [(r[0], r[1]) for r in rows] == [(kept, "1")]
            with engine.connect() as connection, connection.begin():
                other = enqueue(connection, "send_email", {"order": 3})
            return [kept, other]
        finally:
            engine.dispose()

    ids = await asyncio.to_thread(go)
    assert len(set(ids)) == 2


async def test_a_wrong_connection_is_refused(db: object) -> None:
    for conn in (object(), db):  # not psycopg: an asyncpg connection goes to conveyor.enqueue
        with pytest.raises(TypeError, match="psycopg"):
            enqueue(conn, "t")
