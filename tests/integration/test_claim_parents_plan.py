"""A claimed workflow job's dependencies (``job.parents``) are read by their primary keys whatever
the statistics the claim's plan was made with. asyncpg keeps the claim prepared per connection,
PostgreSQL moves it to a generic plan after five runs, and when the lookup was part of that plan,
a plan made while ``jobs`` was small read ``jobs`` whole once per dependency of every fan-in it
claimed, until an ANALYZE invalidated it: by hand on PostgreSQL 15, a 2,000-parent fan-in's
claim in a session planned at 30 rows took 1,090 ms with 12,000 rows (2,000 sequential scans)
against 13 ms in a fresh session. The lookup is the function ``claimed_parents`` (migration
0026, one call per claiming statement; 0025's ``job_parents`` before it, one per claimed job),
whose plan is made with sequential scans off (the workflow trigger's statements have the same
protection: ``test_workflow_trigger_plans.py``).

What remains is the claim's own lookup of the claimed ids on such a plan: one read of ``jobs``
per claim, whatever the job, until the first ANALYZE (autovacuum's, after 1,000 changed rows).
The test measures it on a plain job's claim and requires a fan-in's claim to cost no more."""

from __future__ import annotations

import uuid

import asyncpg

from conveyor import JobSpec, Workflow, enqueue_many, enqueue_workflow
from conveyor.store import for_schema

from .. import db as tdb
from .plans import jobs_never_analyzed, jobs_read_whole, keep_jobs_unanalyzed

PARENTS = 1000  # under the jobs table's autovacuum_analyze_threshold (migration 0009)


async def _fan_in(db: asyncpg.Connection, parents: int) -> uuid.UUID:
    wf = Workflow("fan-in")
    keys = [wf.add(f"p{i}", "t") for i in range(parents)]
    wf.add("join", "t", after=keys)
    async with db.transaction():
        wid = await enqueue_workflow(db, wf)
    # the parents complete (the trigger releases the join)
    await db.execute("UPDATE jobs SET status = 'IN_PROGRESS' WHERE workflow_id = $1"
                     " AND workflow_key <> 'join'", wid)  # fmt: skip
    await db.execute("UPDATE jobs SET status = 'COMPLETED', finished_at = now()"
                     " WHERE workflow_id = $1 AND workflow_key <> 'join'", wid)  # fmt: skip
    join: uuid.UUID = await db.fetchval(
        "SELECT id FROM jobs WHERE workflow_id = $1 AND workflow_key = 'join'", wid
    )
    return join


async def _claim(conn: asyncpg.Connection, ids: list[uuid.UUID]) -> int:
    rows = await for_schema().job_claim_many(
        conn, ids, lease_seconds=30.0, worker_id="test-claim-parents", types=["t"],
        handler_defaults={}, default_max_retries=3,
    )  # fmt: skip
    return len(rows)


async def _scans(conn: asyncpg.Connection, job_id: uuid.UUID) -> tuple[int, int]:
    """Sequential scans of ``jobs`` (and rows read by them) claiming ``job_id``."""

    async def claim() -> None:
        assert await _claim(conn, [job_id]) == 1

    return await jobs_read_whole(conn, claim)


async def test_claiming_a_fan_in_reads_no_table_whole_on_a_plan_made_when_jobs_was_small(
    db: asyncpg.Connection, db_url: str
) -> None:
    await keep_jobs_unanalyzed(db)
    small = await _fan_in(db, 3)
    plain = await enqueue_many(db, [JobSpec("t") for _ in range(8)])

    conn = await tdb.connect(db_url)  # a worker's connection, planning on today's statistics
    try:
        for job_id in plain:  # past the five custom plans: the generic plan from here on
            assert await _claim(conn, [job_id]) == 1
        assert await _claim(conn, [small]) == 1

        big = await _fan_in(db, PARENTS)  # the table grows; no ANALYZE has seen it
        [control] = await enqueue_many(db, [JobSpec("t")])
        assert await jobs_never_analyzed(db)
        plain_scans, _ = await _scans(conn, control)  # the claim's own lookup of its ids
        scans, read = await _scans(conn, big)
        assert scans == plain_scans <= 1, (
            f"claiming a {PARENTS}-parent fan-in scanned jobs {scans} times ({read} rows); "
            f"a plain job's claim {plain_scans}"
        )
    finally:
        await conn.close()
