"""The limited claim is one statement (``store/attempts.py``): it locks the type rows only while
it runs, so a worker frozen between statements cannot keep them locked. Its snapshot predates
the lock; the claims recorded on the type row (read with ``FOR UPDATE``: its newest version)
keep the count exact. Jobs held for a full concurrency limit can stay in the worker's hand
(``room``): leased, no pen, claimed again when a slot frees."""

from __future__ import annotations

import asyncio
import random
import uuid

import asyncpg

from conveyor import enqueue

from .. import db as tdb
from .test_type_limits import _claim, _register, store


async def _blocked_on_a_lock(db: asyncpg.Connection, pid: int) -> None:
    for _ in range(500):
        if await db.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity "
                             "WHERE pid = $1", pid):  # fmt: skip
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the second claim never waited for the type's lock")


async def test_a_claim_committed_while_another_waited_for_the_lock_is_counted(
    db: asyncpg.Connection, db_url: str
) -> None:
    # the second claim's snapshot is taken before the first commits: the jobs table there
    # shows the first claim's jobs PENDING; without the claims recorded on the type row it
    # claimed two more (4 IN_PROGRESS for a limit of 2)
    await _register(db, "lim_e", concurrency=2)
    ids = [await enqueue(db, "lim_e", {"i": i}) for i in range(4)]
    first, second = await tdb.connect(db_url), await tdb.connect(db_url)
    try:
        tx = first.transaction()
        await tx.start()
        got, _ = await _claim(first, ids[:2], "lim_e")
        assert len(got) == 2
        waiting = asyncio.create_task(_claim(second, ids[2:], "lim_e"))
        await _blocked_on_a_lock(db, second.get_server_pid())
        await tx.commit()
        claimed, held = await waiting
    finally:
        await first.close()
        await second.close()
    assert claimed == [] and len(held) == 2
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE status = 'IN_PROGRESS'") == 2


async def test_concurrent_claimers_stay_exact_while_jobs_finish(
    db: asyncpg.Connection, db_url: str
) -> None:
    await _register(db, "lim_y", concurrency=3)
    for i in range(60):
        await enqueue(db, "lim_y", {"i": i})
    conns = [await tdb.connect(db_url) for _ in range(6)]
    rng = random.Random(7)
    peak = 0
    try:
        for _ in range(12):
            waiting = [r["id"] for r in await db.fetch(
                "SELECT id FROM jobs WHERE status = 'PENDING'")]  # fmt: skip
            rng.shuffle(waiting)
            await asyncio.gather(*(_claim(c, waiting[k::6][:4], "lim_y", room=2)
                                   for k, c in enumerate(conns)))  # fmt: skip
            running = [r["id"] for r in await db.fetch(
                "SELECT id FROM jobs WHERE status = 'IN_PROGRESS'")]  # fmt: skip
            peak = max(peak, len(running))
            assert len(running) == 3  # full, never over
            done = rng.sample(running, rng.randint(1, 3))
            await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = ANY($1)", done)
    finally:
        for c in conns:
            await c.close()
    assert peak == 3
    listed = await db.fetchval("SELECT cardinality(claim_ids) FROM job_types "
                               "WHERE name = 'lim_y'")  # fmt: skip
    assert listed <= 3 + 3  # pruned at each claim: running ones and ones finished since


async def test_a_job_held_in_hand_has_a_lease_and_no_pen(db: asyncpg.Connection) -> None:
    await _register(db, "lim_k", concurrency=1)
    ids = [await enqueue(db, "lim_k", {"i": i}) for i in range(4)]
    await db.execute("DELETE FROM job_outbox")
    claimed, held = await _claim(db, ids, "lim_k", room=2)
    assert len(claimed) == 1
    assert sorted(held.values()) == [0, 0, 1]  # two in hand, the one beyond the room in a pen
    in_hand = [i for i, pen in held.items() if pen == 0]
    rows = await db.fetch("SELECT status::text AS s, lease_expires_at > now() + interval '25 s' "
                          "AS leased FROM jobs WHERE id = ANY($1)", in_hand)  # fmt: skip
    assert {(r["s"], r["leased"]) for r in rows} == {("PENDING", True)}
    pens = await db.fetch("SELECT job_id FROM job_outbox")
    assert [p["job_id"] for p in pens] == [i for i, pen in held.items() if pen]
    assert await store.job_overdue_ids(db, "lim_k", after=0.0, limit=10) == []
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = $1", claimed[0].id)
    again, held2 = await _claim(db, in_hand, "lim_k", room=2)  # the slot freed: one runs
    assert len(again) == 1 and list(held2.values()) == [0]


async def test_a_job_released_from_hand_goes_back_through_the_shortest_pen(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "lim_b", concurrency=1)
    ids = [await enqueue(db, "lim_b", {"i": i}) for i in range(2)]
    await db.execute("DELETE FROM job_outbox")
    _, held = await _claim(db, ids, "lim_b", room=1)
    (job_id,) = held
    await store.job_release_held(db, [job_id, uuid.uuid4()])
    row = await db.fetchrow("SELECT status::text AS s, lease_expires_at FROM jobs WHERE id = $1",
                            job_id)  # fmt: skip
    assert row["s"] == "PENDING" and row["lease_expires_at"] is None
    pens = await db.fetch("SELECT job_id, destination, delay_seconds FROM job_outbox")
    assert [tuple(p) for p in pens] == [(job_id, "retry", 1)]
