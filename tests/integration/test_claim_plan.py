"""The claim finds its jobs by id whatever the statistics say about their type (the store's
batch rate at 10 million rows depends on it). ``job_claim_many`` filters ``id = ANY(ids) AND
job_type = ANY(types)``; when ANALYZE has not yet seen a type (new, or grown since), the
planner takes ``job_type = …`` for one row and walks the type's whole range of
``jobs_type_status_id_idx``, filtering the ids: at 10 million rows the bench's claim read
691,500 finished jobs of its type for 500 ids (135 ms instead of ~20). Here: 200,000 generated
jobs analyzed, then 60,000 finished jobs of a type the statistics do not know."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

import asyncpg
import pytest

from conveyor import JobSpec, enqueue_many
from conveyor.store import Attempt, Completion, for_schema
from conveyor.store.registry import bind

from .. import db as tdb
from .plans import generate


class _Rollback(Exception):
    pass


async def _outbox_scans(db: asyncpg.Connection) -> int:
    """Sequential scans of ``job_outbox`` in this transaction so far."""
    n = await db.fetchval(
        "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'job_outbox'::regclass"
    )
    return int(n or 0)


def _nodes(plan: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(plan, dict):
        if "Node Type" in plan:
            found.append(plan)
        for v in plan.values():
            found += _nodes(v)
    elif isinstance(plan, list):
        for v in plan:
            found += _nodes(v)
    return found


# The parameters of the statements that name them, in the order the tests below give them.
_NAMED = {
    "job_claim_many": ("ids", "lease_seconds", "worker_id", "handler_defaults",
                       "default_max_retries", "types"),
    "job_fail_many": ("job_id", "attempt", "error", "delay", "consume"),
}  # fmt: skip


async def _explain(db: asyncpg.Connection, name: str, *args: Any) -> Any:
    """``EXPLAIN (ANALYZE, FORMAT JSON)`` of the store's statement ``name``, rolled back."""
    if name in _NAMED:
        args = tuple(bind(name, dict(zip(_NAMED[name], args, strict=True))))
    tr = db.transaction()
    await tr.start()
    try:
        sql = f"EXPLAIN (ANALYZE, FORMAT JSON) {for_schema().sql[name]}"
        return json.loads(await db.fetchval(sql, *args))
    finally:
        await tr.rollback()


async def _ghosts(db: asyncpg.Connection) -> list[Any]:
    """200,000 generated jobs, analyzed, then 60,000 finished jobs of a type ANALYZE has not
    seen ('ghost'); returns the ids of 20 new PENDING ghosts."""
    await generate(db, 200_000)
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, attempts, finished_at)"
        " SELECT gen_random_uuid(), 'ghost', 'COMPLETED', 5, '{}', 1, now()"
        " FROM generate_series(1, 60000)"
    )
    return await enqueue_many(db, [JobSpec("ghost")] * 20)


async def test_the_claim_reads_its_ids_not_the_types_range(db: asyncpg.Connection) -> None:
    ids = await _ghosts(db)
    plan = await _explain(db, "job_claim_many", ids, 30.0, "w", "{}", 3, ["ghost"])
    root = plan[0]["Plan"]
    assert root["Actual Rows"] == 20
    scans = [  # a workflow job's dependencies are read only for one (never here: no loops)
        n
        for n in _nodes(plan)
        if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"] and n["Actual Loops"]
    ]
    assert [n.get("Index Name") for n in scans] == ["jobs_pkey"], scans
    read = sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans)
    assert read <= 20, read


# The hot path's statements by id, with statistics taken before a backlog arrived (ANALYZE saw an
# empty table, as after a quiet night; the bench's fresh database never has any). The partial
# index ``jobs_waiting_idx`` (PENDING/RETRYING) looks like a few rows then, and a status test
# that implied its predicate let the planner AND a scan of the whole index with the ids: a claim
# of 8 ids read all 20,000 waiting jobs' entries (O(backlog) per claim: in the batch benchmark
# 85-98 us of PostgreSQL CPU per job for the claim instead of 46).
def _args(name: str, ids: list[Any]) -> tuple[Any, ...]:
    n = len(ids)
    return {
        "job_claim_many": (ids, 30.0, "w", "{}", 3, ["hot"]),
        "job_touch_waiting": (ids, 30.0),
        "job_fence_many": (ids,),
        "job_complete_many": (ids, [1] * n, ["null"] * n),
        "job_heartbeat_many": (ids, [1] * n, 30.0),
        "job_release_many": (ids, [1] * n),
        "job_fail_many": (ids, [1] * n, ["e"] * n, [1] * n, [True] * n),
    }[name]


_OF_WAITING = (
    "job_claim_many", "job_touch_waiting", "job_fence_many",
)  # fmt: skip
_OF_RUNNING = ("job_complete_many", "job_heartbeat_many", "job_release_many", "job_fail_many")


async def test_statements_by_id_read_their_ids_with_stale_statistics(
    db: asyncpg.Connection,
) -> None:
    await db.execute("ANALYZE jobs")  # an empty table
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, attempts, lease_expires_at)"
        " SELECT gen_random_uuid(), 'hot', CASE WHEN i % 2 = 0 THEN 'PENDING'"
        " ELSE 'IN_PROGRESS' END::job_status, 5, '{}', i % 2,"
        " CASE WHEN i % 2 = 1 THEN now() + interval '1 hour' END"
        " FROM generate_series(1, 40000) i"
    )
    ids = {
        status: [r["id"] for r in await db.fetch(
            "SELECT id FROM jobs WHERE status = $1 LIMIT 8", status)]
        for status in ("PENDING", "IN_PROGRESS")
    }  # fmt: skip
    bad = {}
    for mode in ("force_custom_plan", "force_generic_plan"):
        await db.execute(f"SET plan_cache_mode = {mode}")
        for name in _OF_WAITING + _OF_RUNNING:
            of = ids["PENDING" if name in _OF_WAITING else "IN_PROGRESS"]
            plan = await _explain(db, name.split()[0], *_args(name, of))
            # 8 ids: an index scan on jobs that returns more read something else
            wide = [
                (n["Index Name"], n["Actual Rows"])
                for n in _nodes(plan)
                if n.get("Index Name", "").startswith("jobs_") and n["Actual Rows"] > 64
            ]
            if wide:
                bad[(mode, name)] = wide
    await db.execute("RESET plan_cache_mode")
    assert not bad, "\n".join(f"{k}: {v}" for k, v in bad.items())


# A worker's statements are prepared once per connection, and after five runs PostgreSQL may keep
# a generic plan for good (until an ANALYZE invalidates it). Made for the tables a fresh install
# starts with, the finishing statements' plan was a hash join over a bitmap scan of
# jobs_lease_idx (its predicate, status = 'IN_PROGRESS', follows from theirs) that later walked
# the dead entries of every job claimed since: in the benchmark, with autovacuum off, 553
# buffers per completion call, 201 per job. Here: one connection claims and completes 20,000
# jobs as a worker does, and the last 1,280 may read only their own rows.
async def test_finishing_statements_keep_reading_their_ids_on_one_connection(
    db: asyncpg.Connection,
) -> None:
    store = for_schema()
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload)"
        " SELECT gen_random_uuid(), 'noop', 'PENDING', 5, '{}' FROM generate_series(1, 20000)"
    )
    waiting = [r["id"] for r in await db.fetch("SELECT id FROM jobs")]

    async def cycle(beat: bool = False) -> None:
        pending = [waiting.pop() for _ in range(128)]
        claimed = await store.job_claim_many(
            db, pending, lease_seconds=30.0, worker_id="w", types=["noop"], handler_defaults={},
            default_max_retries=3,
        )  # fmt: skip
        if beat:
            await store.job_heartbeat_many(
                db, [Attempt(j.id, j.attempts) for j in claimed], lease_seconds=30.0
            )
        for i in range(0, len(claimed), 10):
            part = claimed[i : i + 10]
            await store.job_complete_many(db, [Completion(j.id, j.attempts, "null") for j in part])

    reads = """
SELECT (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes
        WHERE relname = 'jobs' AND indexrelname <> 'jobs_pkey') AS idx,
       (SELECT seq_tup_read FROM pg_stat_user_tables WHERE relname = 'jobs') AS seq"""
    for _ in range(146):
        await cycle(beat=True)
    await db.execute("SELECT pg_stat_force_next_flush()")
    before = await db.fetchrow(reads)
    for _ in range(10):
        await cycle(beat=True)
    await db.execute("SELECT pg_stat_force_next_flush()")
    after = await db.fetchrow(reads)
    # 1,280 jobs claimed, heartbeated and completed: reading them by id costs no scan of
    # another index and no sequential scan of jobs
    assert after["idx"] - before["idx"] < 1280, dict(after)
    assert after["seq"] - before["seq"] < 1280, dict(after)


@pytest.mark.parametrize("backlog", [0, 48_000])
async def test_the_claim_of_released_jobs_probes_the_outbox_by_id_whatever_it_lists(
    db: asyncpg.Connection, backlog: int
) -> None:
    """``job_claim_released`` reads the outbox rows its transaction's release listed (a
    fan-out's root lists one per leaf) by primary key, however many the list holds, however big
    the outbox has grown (a relay behind) and whatever ANALYZE saw of it. Joined to the list,
    the planner hashed a big outbox whole to join 2,000 ids; with ``= ANY`` of the list in the
    statement and an outbox ANALYZE had seen empty (as it mostly is), it scanned the outbox and
    parsed the whole list again for each row: 96-131 ms for a 1,000-job release, 9.5-11 s for
    9,999. The lookup is ``take_released`` (migration 0026), planned with sequential scans off.
    Here: 2,000 listed, alone in the outbox or beside a ``backlog`` of 48,000, ANALYZE taken
    before the release; every plan (the first five custom ones, then whichever PostgreSQL
    keeps, and each kind forced) reads no outbox row but by its key, and takes the one row its
    room allows."""
    # the release's 2,000 jobs (PENDING, their outbox rows listed) and the backlog
    released = [uuid.uuid4() for _ in range(2000)]
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload) "
        "SELECT id, 'echo', 'PENDING', 5, '{}' FROM unnest($1::uuid[]) AS id",
        released,
    )
    filler = "INSERT INTO job_outbox (job_id, job_type, priority) "
    filler += "SELECT gen_random_uuid(), 'echo', 5 FROM generate_series(1, $1)"
    await db.execute(filler, backlog)
    await db.execute("ANALYZE job_outbox")
    listed = ",".join(
        str(r["id"])
        for r in await db.fetch(
            "INSERT INTO job_outbox (job_id, job_type, priority) "
            "SELECT id, 'echo', 5 FROM unnest($1::uuid[]) AS id RETURNING id",
            released,
        )
    )
    store = for_schema()
    modes = ["auto"] * 7 + ["force_custom_plan", "force_generic_plan"]
    for turn, mode in enumerate(modes):  # each rolled back
        with contextlib.suppress(_Rollback):
            async with db.transaction():
                await db.execute(f"SET LOCAL plan_cache_mode = {mode}")
                await db.execute(
                    "SELECT set_config($1, $2, true)", f"{tdb.SCHEMA}.wf_released", listed
                )
                before = await _outbox_scans(db)
                claimed = await store.job_claim_released(
                    db, room=1, lease_seconds=30.0, worker_id="w", types=["echo"],
                    handler_defaults={}, default_max_retries=3,
                )  # fmt: skip
                scans = await _outbox_scans(db)
                left = await db.fetchval(
                    "SELECT count(*) FROM job_outbox WHERE id = ANY($1::int8[])",
                    [int(i) for i in listed.split(",")],
                )
                assert scans == before, (turn, before, scans)
                assert len(claimed) == 1, turn
                assert left == 1999, turn  # the room's one row taken, the rest left to the relay
                raise _Rollback
