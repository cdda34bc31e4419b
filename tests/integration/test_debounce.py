"""Debounce (``job_debounce`` in store/sql/jobs.sql): while a job of its type and debounce key
waits (never started), a submit folds into it: its payload replaced, its start moved to
``debounce_seconds`` from now but never past ``debounce_max_seconds`` after the first submit.
Once admitted, a submit makes a new job. Concurrent submits with one key make one job; an
application's open transaction holding the key makes a submit fail fast, not hang."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from conveyor import JobRouter, enqueue
from conveyor.core.errors import DebounceBusy, IdempotencyConflict, InvalidJob
from conveyor.jobs.types import register_router_types
from conveyor.store import for_schema

from .. import db as tdb

store = for_schema()


async def _noop(job: object) -> None:
    return None


async def _register(db: asyncpg.Connection, name: str, **options: object) -> None:
    r = JobRouter()
    r.job(name, **options)(_noop)  # type: ignore[arg-type]
    await register_router_types(db, r)


async def _job(db: asyncpg.Connection, job_id: object) -> asyncpg.Record:
    return await db.fetchrow(
        "SELECT status::text AS status, payload, run_at - now() AS due_in, "
        "debounce_until - now() AS until_in, partition_key FROM jobs WHERE id = $1",
        job_id,
    )


async def test_submits_fold_into_the_waiting_job_until_it_is_admitted(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "deb")  # no limits: a debounced job still waits for admission
    first = await enqueue(db, "deb", {"v": 1}, debounce_seconds=30, debounce_max_seconds=100)
    row = await _job(db, first)
    assert row["status"] == "WAITING" and row["partition_key"] == ""
    await db.execute("UPDATE jobs SET run_at = now() + interval '5 s', "
                     "debounce_until = now() + interval '40 s' WHERE id = $1", first)  # fmt: skip
    again = await enqueue(db, "deb", {"v": 2}, debounce_seconds=30, debounce_max_seconds=100)
    assert again == first
    row = await _job(db, first)
    assert row["payload"] == '{"v": 2}'  # the latest payload
    assert 29 < row["due_in"].total_seconds() <= 30  # moved to 30 s from now
    await db.execute("UPDATE jobs SET debounce_until = now() + interval '10 s' WHERE id = $1",
                     first)  # fmt: skip
    assert await enqueue(db, "deb", {"v": 3}, debounce_seconds=30) == first
    assert (await _job(db, first))["due_in"].total_seconds() <= 10  # never past the maximum
    await db.execute("UPDATE jobs SET run_at = now() WHERE id = $1", first)
    assert await store.admit(db, "deb", 10) == 1
    later = await enqueue(db, "deb", {"v": 4}, debounce_seconds=30)
    assert later != first  # it started: a new job
    other = await enqueue(db, "deb", {"v": 5}, debounce_seconds=30, debounce_key="other")
    assert other not in (first, later)


async def test_the_partition_key_is_the_default_debounce_key(db: asyncpg.Connection) -> None:
    await _register(db, "deb_p", partition_by="doc", partition_concurrency=1)
    a1 = await enqueue(db, "deb_p", {"doc": "a", "v": 1}, debounce_seconds=5)
    b1 = await enqueue(db, "deb_p", {"doc": "b", "v": 1}, debounce_seconds=5)
    a2 = await enqueue(db, "deb_p", {"doc": "a", "v": 2}, debounce_seconds=5)
    assert a1 == a2 and a1 != b1


async def test_concurrent_submitters_make_one_job(db: asyncpg.Connection, db_url: str) -> None:
    await _register(db, "deb_c")
    conns = [await tdb.connect(db_url) for _ in range(16)]
    try:
        ids = await asyncio.gather(
            *(enqueue(c, "deb_c", {"n": n}, debounce_seconds=10) for n, c in enumerate(conns))
        )
    finally:
        for c in conns:
            await c.close()
    assert len(set(ids)) == 1
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE job_type = 'deb_c'") == 1


async def test_an_open_transaction_holding_the_key_makes_a_submit_fail_fast(
    db: asyncpg.Connection, db_url: str
) -> None:
    await _register(db, "deb_t")
    app = await tdb.connect(db_url)
    try:
        tx = app.transaction()
        await tx.start()
        await enqueue(app, "deb_t", {"v": 1}, debounce_seconds=10)  # not committed
        t0 = time.monotonic()
        with pytest.raises(DebounceBusy):
            await enqueue(db, "deb_t", {"v": 2}, debounce_seconds=10)
        assert time.monotonic() - t0 < 5
        await tx.rollback()
    finally:
        await app.close()
    # the bound was the statement's own: this session's lock_timeout is as it was
    assert await db.fetchval(
        "SELECT setting = reset_val FROM pg_settings WHERE name = 'lock_timeout'"
    )


async def test_a_submit_in_a_transaction_keeps_the_transactions_lock_bound(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "deb_b")
    async with db.transaction():
        await db.execute("SET LOCAL lock_timeout = '7s'")
        await enqueue(db, "deb_b", {}, debounce_seconds=1)
        assert await db.fetchval("SHOW lock_timeout") == "7s"


@pytest.mark.parametrize(
    "options",
    [
        {"debounce_seconds": 0},
        {"debounce_seconds": float("nan")},
        {"debounce_seconds": 5, "debounce_max_seconds": 0},
        {"debounce_max_seconds": 5},
        {"debounce_key": "k"},
        {"debounce_seconds": 1, "debounce_key": ""},
        {"debounce_seconds": 1, "delay_seconds": 3},
        {"debounce_seconds": 1, "unique_for": 3},
    ],
)
async def test_bad_debounce_options_are_refused(db: asyncpg.Connection, options: dict) -> None:
    await _register(db, "deb_bad")
    with pytest.raises(InvalidJob):
        await enqueue(db, "deb_bad", {}, **options)
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE job_type = 'deb_bad'") == 0


async def test_an_idempotency_key_replays_the_job_its_submit_created(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "deb_i")
    first = await enqueue(db, "deb_i", {"v": 1}, debounce_seconds=5, idempotency_key="k1")
    assert await enqueue(db, "deb_i", {"v": 1}, debounce_seconds=5, idempotency_key="k1") == first
    folded = await enqueue(db, "deb_i", {"v": 2}, debounce_seconds=5, idempotency_key="k2")
    assert folded == first  # folded: k2 names no job of its own
    with pytest.raises(IdempotencyConflict):  # k1 with other arguments
        await enqueue(db, "deb_i", {"v": 3}, debounce_seconds=5, idempotency_key="k1")
