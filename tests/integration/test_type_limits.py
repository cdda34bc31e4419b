"""Fleet-wide limits in the claim (``store/attempts.py``): at most ``concurrency`` IN_PROGRESS
and ``rate_limit`` starts per sliding window, whoever claims; the jobs over a limit are held
(PENDING, no attempt counted, touched, sent through a holding pen), never claimed."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from conveyor import JobRouter, enqueue
from conveyor.jobs.types import register_router_types, router_types
from conveyor.store import ClaimedJob, for_schema

from .. import db as tdb

store = for_schema()


async def _register(db: asyncpg.Connection, name: str, **limits: object) -> None:
    r = JobRouter()
    r.job(name, **limits)(_noop)  # type: ignore[arg-type]
    await register_router_types(db, r)


async def _noop(job: object) -> None:
    return None


async def _claim(conn: asyncpg.Connection, ids: list[uuid.UUID], name: str, room: int = 0
                 ) -> tuple[list[ClaimedJob], dict[uuid.UUID, int]]:  # fmt: skip
    """The worker's claim: one statement, no transaction around it."""
    return await store.job_claim_controlled(
        conn, ids, lease_seconds=30.0, worker_id="w", types=[name], handler_defaults={},
        default_max_retries=3, room={name: room},
    )  # fmt: skip


async def test_concurrency_claims_up_to_the_limit_and_holds_the_rest(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "lim_c", concurrency=2)
    ids = [await enqueue(db, "lim_c", {"i": i}) for i in range(5)]
    await db.execute("DELETE FROM job_outbox")
    claimed, held = await _claim(db, ids, "lim_c")
    assert len(claimed) == 2 and len(held) == 3
    assert set(held.values()) == {1}  # fresh jobs: the shortest pen
    rows = await db.fetch("SELECT id, status::text AS s, attempts FROM jobs WHERE id = ANY($1)",
                          list(held))  # fmt: skip
    assert {(r["s"], r["attempts"]) for r in rows} == {("PENDING", 0)}  # no attempt, no retry
    pens = await db.fetch("SELECT job_id, destination, delay_seconds FROM job_outbox")
    assert {(p["job_id"], p["destination"], p["delay_seconds"]) for p in pens} == {
        (i, "retry", 1) for i in held
    }
    again, held2 = await _claim(db, list(held), "lim_c")  # still full: held again
    assert again == [] and set(held2) == set(held)
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = $1", claimed[0].id)
    third, held3 = await _claim(db, list(held), "lim_c")  # one slot freed
    assert len(third) == 1 and len(held3) == 2


async def test_a_long_wait_is_held_in_a_longer_pen(db: asyncpg.Connection) -> None:
    await _register(db, "lim_w", concurrency=1)
    ids = [await enqueue(db, "lim_w", {"i": i}) for i in range(2)]
    await db.execute("UPDATE jobs SET run_at = now() - interval '30 seconds'")
    claimed, held = await _claim(db, ids, "lim_w")
    assert len(claimed) == 1 and list(held.values()) == [10]  # a quarter of 30 s, snapped up


async def test_the_rate_limit_is_a_sliding_window(db: asyncpg.Connection) -> None:
    await _register(db, "lim_r", rate_limit="3/20s")
    ids = [await enqueue(db, "lim_r", {"i": i}) for i in range(5)]
    claimed, held = await _claim(db, ids, "lim_r")
    assert len(claimed) == 3 and len(held) == 2
    assert set(held.values()) == {20}  # until the window's oldest start leaves it
    starts = await db.fetchval("SELECT cardinality(recent_starts) FROM job_types "
                               "WHERE name = 'lim_r'")  # fmt: skip
    assert starts == 3
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE status = 'IN_PROGRESS'")
    assert (await _claim(db, list(held), "lim_r"))[0] == []  # finishing frees no start
    await db.execute(  # the window moves on: the starts are 21 s old
        "UPDATE job_types SET recent_starts = ARRAY(SELECT s - interval '21 seconds' "
        "FROM unnest(recent_starts) s) WHERE name = 'lim_r'"
    )
    later, _ = await _claim(db, list(held), "lim_r")
    assert len(later) == 2


async def test_each_held_job_waits_for_its_own_start_to_leave_the_window(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "lim_s", rate_limit="3/20s")
    await db.execute(
        "UPDATE job_types SET recent_starts = ARRAY[now() - interval '15 seconds', "
        "now() - interval '5 seconds'] WHERE name = 'lim_s'"
    )
    ids = [await enqueue(db, "lim_s", {"i": i}) for i in range(4)]
    claimed, held = await _claim(db, ids, "lim_s")
    assert len(claimed) == 1  # the window had room for one more
    # the 1st held job waits for the start 15 s ago (5 s), the 2nd for the one 5 s ago (15 s),
    # the 3rd for the one just made (20 s)
    assert sorted(held.values()) == [5, 15, 20]


async def test_a_paused_type_is_held_not_claimed(db: asyncpg.Connection) -> None:
    await _register(db, "lim_p")
    job_id = await enqueue(db, "lim_p", {})
    assert await store.type_set_paused(db, "lim_p", True)
    claimed, held = await _claim(db, [job_id], "lim_p")
    assert claimed == [] and held == {job_id: 5}


async def test_concurrent_claimers_never_exceed_the_limit(
    db: asyncpg.Connection, db_url: str
) -> None:
    await _register(db, "lim_x", concurrency=3)
    ids = [await enqueue(db, "lim_x", {"i": i}) for i in range(12)]
    conns = [await tdb.connect(db_url) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(_claim(c, ids[k * 3 : k * 3 + 3], "lim_x") for k, c in enumerate(conns))
        )
    finally:
        for c in conns:
            await c.close()
    assert sum(len(r[0]) for r in results) == 3
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE status = 'IN_PROGRESS'") == 3


async def test_operator_limits_survive_a_worker_registering_the_type(
    db: asyncpg.Connection,
) -> None:
    r = JobRouter()
    r.job("lim_o", concurrency=5, rate_limit="100/m")(_noop)
    await store.job_type_register_many(db, router_types(r))
    row = await db.fetchrow("SELECT concurrency, rate_limit, rate_period, limits_set_at "
                            "FROM job_types WHERE name = 'lim_o'")  # fmt: skip
    assert tuple(row) == (5, 100, 60, None)
    await store.type_set_limits(db, "lim_o", concurrency=2, rate_limit=None, rate_period=None)
    await store.job_type_register_many(db, router_types(r))  # a worker restarts
    row = await db.fetchrow("SELECT concurrency, rate_limit, limits_set_at FROM job_types "
                            "WHERE name = 'lim_o'")  # fmt: skip
    assert row["concurrency"] == 2 and row["rate_limit"] is None
    assert row["limits_set_at"] is not None


# A job held for a long rate window sits in a pen longer than reconcile_after while it looks due,
# untouched and missing from its queue: it must not count as overdue, or every reconcile pass
# would re-publish another copy.
async def test_a_job_held_for_its_rate_window_is_not_overdue_while_in_its_pen(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "lim_h", rate_limit="1/h")
    ids = [await enqueue(db, "lim_h", {"i": i}) for i in range(2)]
    await db.execute("UPDATE jobs SET run_at = now() - interval '5 minutes', "
                     "created_at = now() - interval '5 minutes'")  # fmt: skip
    claimed, held = await _claim(db, ids, "lim_h")
    assert len(claimed) == 1 and len(held) == 1
    (delay,) = held.values()
    assert delay >= 3600 - 5  # the pen hands it back when the window frees a start
    await db.execute("DELETE FROM job_outbox")  # the relay published the pen message
    # two minutes on (its updated_at no longer fresh): still not due, so not "missing"
    await db.execute("UPDATE jobs SET updated_at = now() - interval '2 minutes' WHERE id = $1",
                     next(iter(held)))  # fmt: skip
    assert await store.job_count_overdue(db, after=60.0) == {}
    assert await store.job_overdue_ids(db, "lim_h", after=60.0, limit=10) == []
    run_at = await db.fetchval("SELECT run_at FROM jobs WHERE id = $1", next(iter(held)))
    now = await db.fetchval("SELECT now()")
    assert (run_at - now).total_seconds() >= delay - 5


async def test_a_job_held_long_in_another_hand_takes_the_free_slot_first(
    db: asyncpg.Connection,
) -> None:
    """Worker a holds j1 in its hand, worker b holds j2 in its own; a slot frees. While j1 is
    younger than ``steal_after`` it is left to a: b's hand claim takes its own j2. Held longer
    (a's retries got it no slot), j1 is first in line: b's fresh delivery leaves it the slot
    (held instead), and b's hand claim takes j1, not j2; a's claim then finds j1 taken."""
    await _register(db, "lim_s", concurrency=1)
    j0, j1, j2, j3, j4 = [await enqueue(db, "lim_s", {"i": i}) for i in range(5)]

    async def claim(worker: str, ids: list[uuid.UUID], steal: bool = False) -> tuple[
        list[uuid.UUID], dict[uuid.UUID, int]
    ]:  # fmt: skip
        rows, held = await store.job_claim_controlled(
            db, ids, lease_seconds=30.0, worker_id=worker, types=["lim_s"], handler_defaults={},
            default_max_retries=3, room={"lim_s": 4}, steal=steal, steal_after=2.0,
        )  # fmt: skip
        return [r.id for r in rows], held

    assert (await claim("a", [j0]))[0] == [j0]
    assert await claim("a", [j1]) == ([], {j1: 0})
    assert await claim("b", [j2]) == ([], {j2: 0})
    holders = dict(await db.fetch("SELECT id, held_by FROM jobs WHERE held_by IS NOT NULL"))
    assert holders == {j1: "a", j2: "b"}
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = $1", j0)
    # j1 held for less than steal_after: b's hand claim runs b's own job
    assert (await claim("b", [j2], steal=True))[0] == [j2]
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = $1", j2)
    # and a fresh delivery takes a free slot
    assert await claim("b", [j3]) == ([j3], {})
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = $1", j3)
    await db.execute(
        "UPDATE jobs SET held_since = held_since - interval '5 s' WHERE id = $1", j1
    )  # a's retries got it no slot for 5 s
    # b's fresh delivery leaves the free slot to j1, and b's hand takes j1 before its own
    assert await claim("b", [j4]) == ([], {j4: 0})
    assert await claim("b", [j4], steal=True) == ([j1], {j4: 0})
    assert await claim("a", [j1], steal=True) == ([], {})  # taken: gone from a's hand
    row = await db.fetchrow("SELECT status::text, attempts, worker_id FROM jobs WHERE id = $1", j1)
    assert tuple(row) == ("IN_PROGRESS", 1, "b")
