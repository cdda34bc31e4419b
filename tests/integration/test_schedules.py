"""Schedules in the sweeper: exactly one job per tick however many sweepers step at once (the
due schedules are locked, and each tick's job holds a unique key), missed ticks, pause/resume,
and schedules declared on handlers. Every pass gets its ``now``: no sleeping."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson

from conveyor import Job, JobRouter, enqueue
from conveyor.core.config import Settings
from conveyor.jobs.schedules import build_schedule, resume_at
from conveyor.jobs.types import register_router_schedules
from conveyor.maintenance.schedules import tick_job
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import for_schema

from .. import db as tdb

T0 = datetime(2030, 1, 1, tzinfo=UTC)
store = for_schema(tdb.SCHEMA)


async def _add(db: asyncpg.Connection, name: str, now: datetime = T0, **kw: object) -> None:
    new = build_schedule(name, kw.pop("job_type", "t"), now=now - timedelta(microseconds=1), **kw)  # type: ignore[arg-type]
    assert await store.schedule_upsert(db, new) is not None


async def _jobs_per_tick(db: asyncpg.Connection, name: str) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT meta->>'tick' AS tick, count(*) AS n FROM jobs WHERE meta->>'schedule' = $1 "
        "GROUP BY 1",
        name,
    )
    return {r["tick"]: r["n"] for r in rows}


async def test_two_sweepers_stepping_together_enqueue_each_tick_once(
    settings: Settings, db: asyncpg.Connection
) -> None:
    await _add(db, "every", every_seconds=1)
    await _add(db, "cron", cron="* * * * *")
    await _add(db, "five", every_seconds=5, payload={"k": 1}, priority="high")
    a, b = Sweeper(settings), Sweeper(settings)
    await a.start()
    await b.start()
    try:
        steps = 600  # 300 s of ticks, a pass every 0.5 s, the second sweeper 0.25 s behind
        for k in range(steps):
            now = T0 + timedelta(seconds=k * 0.5)
            await asyncio.gather(
                a.enqueue_due_schedules(now),
                b.enqueue_due_schedules(now - timedelta(seconds=0.25)),
                b.enqueue_due_schedules(now),
            )
        end = T0 + timedelta(seconds=(steps - 1) * 0.5)
    finally:
        await a.close()
        await b.close()
    every = await _jobs_per_tick(db, "every")
    assert len(every) == int((end - T0).total_seconds()) + 1 == 300
    assert set(every.values()) == {1}
    cron = await _jobs_per_tick(db, "cron")
    assert cron == {(T0 + timedelta(minutes=m)).isoformat(): 1 for m in range(5)}
    five = await _jobs_per_tick(db, "five")
    assert len(five) == 60 and set(five.values()) == {1}
    row = await db.fetchrow(
        "SELECT payload::text AS p, priority, status::text AS s FROM jobs "
        "WHERE meta->>'schedule' = 'five' LIMIT 1"
    )
    assert (row["p"], row["priority"], row["s"]) == ('{"k": 1}', 9, "PENDING")
    # every job has its outbox row
    assert await db.fetchval("SELECT count(*) FROM jobs") == await db.fetchval(
        "SELECT count(*) FROM job_outbox"
    )


async def test_a_stale_sweeper_cannot_enqueue_a_tick_twice(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """Without the lock (a sweeper that read the schedule before another moved it on), the
    tick's unique key still refuses a second job."""
    await _add(db, "s", every_seconds=60)
    row = await store.schedule_get(db, "s")
    assert row is not None
    sweeper = Sweeper(settings)
    await sweeper.start()
    try:
        done = await sweeper.enqueue_due_schedules(T0 + timedelta(seconds=61))
        assert done.enqueued == 1
        tick = T0 + timedelta(seconds=60)
        replay = await store.job_insert_checked(db, [tick_job(row, tick)])
        assert not replay.inserted and len(replay.duplicates) == 1
        again = await sweeper.enqueue_due_schedules(T0 + timedelta(seconds=61))
        assert again.enqueued == 0
    finally:
        await sweeper.close()
    assert await _jobs_per_tick(db, "s") == {tick.isoformat(): 1}


async def test_missed_ticks_skip_or_run_the_last_one(
    settings: Settings, db: asyncpg.Connection
) -> None:
    await _add(db, "skip", cron="*/5 * * * *")
    await _add(db, "last", cron="*/5 * * * *", catch_up="last")
    sweeper = Sweeper(settings)
    await sweeper.start()
    try:  # the first pass comes two hours late
        done = await sweeper.enqueue_due_schedules(T0 + timedelta(hours=2, minutes=2))
    finally:
        await sweeper.close()
    assert await _jobs_per_tick(db, "skip") == {}
    assert await _jobs_per_tick(db, "last") == {(T0 + timedelta(hours=2)).isoformat(): 1}
    assert done.missed == 25 + 24  # 00:00 … 02:00 every 5 minutes; "last" ran one of them
    nxt = await db.fetchval("SELECT next_run_at FROM schedules WHERE name = 'skip'")
    assert nxt == T0 + timedelta(hours=2, minutes=5)


async def test_pause_and_resume(settings: Settings, db: asyncpg.Connection) -> None:
    await _add(db, "p", every_seconds=10)
    sweeper = Sweeper(settings)
    await sweeper.start()
    try:
        await store.schedule_set_enabled(db, "p", False, None)
        assert (await sweeper.enqueue_due_schedules(T0 + timedelta(seconds=35))).enqueued == 0
        row = await store.schedule_get(db, "p")
        assert row is not None
        now = T0 + timedelta(seconds=35)
        await store.schedule_set_enabled(db, "p", True, resume_at(row, now))
        # ticks that fell while paused never run; the next one does
        assert (await sweeper.enqueue_due_schedules(now)).enqueued == 0
        assert (await sweeper.enqueue_due_schedules(now + timedelta(seconds=5))).enqueued == 1
    finally:
        await sweeper.close()
    assert list(await _jobs_per_tick(db, "p")) == [(T0 + timedelta(seconds=40)).isoformat()]


router = JobRouter()


@router.job("sched_code", every=30)
async def scheduled(job: Job) -> None:
    return None


async def test_handler_schedules_register_and_keep_an_operators_pause(
    db: asyncpg.Connection,
) -> None:
    assert await register_router_schedules(db, router, store=store) == ["sched_code"]
    row = await store.schedule_get(db, "sched_code")
    assert row is not None and row.every_seconds == 30 and row.source == "code"
    await store.schedule_set_enabled(db, "sched_code", False, None)
    await register_router_schedules(db, router, store=store)  # the next worker start
    row = await store.schedule_get(db, "sched_code")
    assert row is not None and not row.enabled and row.next_run_at is None
    # an API schedule of the same name is not overwritten by code
    await store.schedule_delete(db, "sched_code")
    await _add(db, "sched_code", every_seconds=60, job_type="t")
    assert await register_router_schedules(db, router, store=store) == []
    row = await store.schedule_get(db, "sched_code")
    assert row is not None and row.source == "api" and row.every_seconds == 60


async def test_retention_deletes_expired_unique_keys(
    sweeper: Sweeper, db: asyncpg.Connection
) -> None:
    await db.execute(
        "INSERT INTO job_uniques (key, job_id, expires_at) SELECT 'k' || g, gen_random_uuid(), "
        "now() + (CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END) * interval '1 hour' "
        "FROM generate_series(1, 2500) g"
    )
    await sweeper.delete_expired()
    assert await db.fetchval("SELECT count(*) FROM job_uniques") == 1250
    assert await db.fetchval("SELECT count(*) FROM job_uniques WHERE expires_at < now()") == 0


async def test_a_large_float_in_a_schedule_payload_reaches_its_job_as_enqueue_stores_it(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """jsonb prints ``1e+20`` as ``100000000000000000000``: a reader would get an integer. The
    schedule's payload and each tick's job read back with the floats given, as an enqueued
    job's payload does."""
    payload = {"big": 1e20, "huge": 1e300, "negative": -4.324448394381094e16, "small": 1.5}
    await _add(db, "floats", every_seconds=60, payload=payload)
    sweeper = Sweeper(settings)
    await sweeper.start()
    try:
        await sweeper.enqueue_due_schedules(T0)
    finally:
        await sweeper.close()
    ticked = await db.fetchval("SELECT payload::text FROM jobs WHERE meta->>'schedule' = 'floats'")
    enqueued_id = await enqueue(db, "t", payload)
    enqueued = await db.fetchval("SELECT payload::text FROM jobs WHERE id = $1", enqueued_id)
    assert ticked == enqueued
    back = orjson.loads(ticked)
    assert back == payload and all(type(v) is float for v in back.values())
    schedule = await store.schedule_get(db, "floats")
    assert schedule is not None and schedule.payload == payload
