"""The workflow trigger finds every row it touches by an index, whatever the statistics were when
its statements were planned. They run on generic plans, planned once per session; a session that
planned them while ``jobs`` was small or never analyzed (a fresh install, a burst of new jobs
before autovacuum's ANALYZE) kept a hash join over a sequential scan of ``jobs`` for the
count-down of a fan-in's dependent: a read of the whole table for every statement completing a
few of its parents (0.2 ms per thousand rows, per statement). ``pg_stat_xact_user_tables``
counts the transaction's scans of ``jobs``, the trigger's statements included."""

from __future__ import annotations

import uuid

import asyncpg

from conveyor import JobSpec, Workflow, enqueue_many, enqueue_workflow

from .. import db as tdb
from .plans import jobs_never_analyzed, jobs_read_whole, keep_jobs_unanalyzed

LEAVES = 1000  # a table this small is read whole by a plan made for it; 2,000 already not

# One row by its primary key: an index scan on a table of a few thousand rows, analyzed or not
# (the control below shows this statement alone reads no table whole).
COMPLETE = "UPDATE jobs SET status = 'COMPLETED', finished_at = now() WHERE id = $1"


async def _seq_scans_of_completing(conn: asyncpg.Connection, job_id: uuid.UUID) -> int:
    scans, _ = await jobs_read_whole(conn, lambda: conn.execute(COMPLETE, job_id))
    return scans


async def test_completing_a_fan_ins_parents_reads_no_table_whole(
    db: asyncpg.Connection, db_url: str
) -> None:
    await keep_jobs_unanalyzed(db)
    wf = Workflow("fan")
    root = wf.add("root", "t")
    leaves = [wf.add(f"leaf-{i}", "t", after=[root]) for i in range(LEAVES)]
    wf.add("join", "t", after=leaves)
    async with db.transaction():
        wid = await enqueue_workflow(db, wf)
        plain = await enqueue_many(db, [JobSpec("t") for _ in range(5)])
    rows = await db.fetch("SELECT workflow_key, id FROM jobs WHERE workflow_id = $1", wid)
    ids = {r["workflow_key"]: r["id"] for r in rows}
    await db.execute("UPDATE jobs SET status = 'IN_PROGRESS' WHERE id = $1", ids["root"])
    await db.execute(COMPLETE, ids["root"])  # releases the leaves
    some = [ids[f"leaf-{i}"] for i in range(5)]
    await db.execute("UPDATE jobs SET status = 'IN_PROGRESS' WHERE id = ANY($1)", some + plain)
    assert await jobs_never_analyzed(db), "analyzed: the plans below would not be a fresh install's"

    # a new session: the trigger's statements are planned now, on these statistics
    conn = await tdb.connect(db_url)
    try:
        control = [await _seq_scans_of_completing(conn, job_id) for job_id in plain]
        assert control == [0] * len(plain), "the test's own statement scanned jobs"
        scans = [await _seq_scans_of_completing(conn, job_id) for job_id in some]
        assert scans == [0] * len(some), f"sequential scans of jobs per completion: {scans}"
        deps = await conn.fetchval("SELECT deps_pending FROM jobs WHERE id = $1", ids["join"])
        assert deps == LEAVES - len(some)  # counted down (by an index)
    finally:
        await conn.close()
