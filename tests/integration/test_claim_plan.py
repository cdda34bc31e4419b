"""The claim finds its jobs by id whatever the statistics say about their type (issue 14: the
store's batch rate at 10 million rows). ``job_claim_many`` filters ``id = ANY(ids) AND
job_type = ANY(types)``; when ANALYZE has not yet seen a type (new, or grown since), the
planner takes ``job_type = …`` for one row and walks the type's whole range of
``jobs_type_status_id_idx``, filtering the ids: at 10 million rows the bench's claim read
691,500 finished jobs of its type for 500 ids (135 ms instead of ~20). Here: 200,000 generated
jobs analyzed, then 60,000 finished jobs of a type the statistics do not know."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from conveyor import JobSpec, enqueue_many
from conveyor.store import for_schema

from .plans import generate


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


async def test_the_claim_reads_its_ids_not_the_types_range(db: asyncpg.Connection) -> None:
    await generate(db, 200_000)
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, attempts, finished_at)"
        " SELECT gen_random_uuid(), 'ghost', 'COMPLETED', 5, '{}', 1, now()"
        " FROM generate_series(1, 60000)"
    )
    ids = await enqueue_many(db, [JobSpec("ghost")] * 20)
    sql = for_schema().sql["job_claim_many"]
    args = (ids, 30.0, "w", "{}", 3, ["ghost"])
    tr = db.transaction()
    await tr.start()
    try:
        plan = json.loads(await db.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args))
    finally:
        await tr.rollback()
    root = plan[0]["Plan"]
    assert root["Actual Rows"] == 20
    scans = [
        n for n in _nodes(plan) if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
    ]
    assert [n.get("Index Name") for n in scans] == ["jobs_pkey"], scans
    read = sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans)
    assert read <= 20, read


async def test_the_controlled_claim_reads_its_ids_not_the_types_range(
    db: asyncpg.Connection,
) -> None:
    # the claim of a type with a concurrency/rate limit or pause (job_claim_controlled) has the
    # same type test in its candidates: it must not walk the unanalyzed type's range either
    from conveyor.core.jobs import PEN_LADDER

    await generate(db, 200_000)
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, attempts, finished_at)"
        " SELECT gen_random_uuid(), 'ghost', 'COMPLETED', 5, '{}', 1, now()"
        " FROM generate_series(1, 60000)"
    )
    ids = await enqueue_many(db, [JobSpec("ghost")] * 20)
    sql = for_schema().sql["job_claim_controlled"]
    args = (ids, 30.0, "w", "{}", 3, ["ghost"], list(PEN_LADDER))
    tr = db.transaction()
    await tr.start()
    try:
        plan = json.loads(await db.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args))
    finally:
        await tr.rollback()
    scans = [
        n for n in _nodes(plan) if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
    ]
    seen = [(n.get("Index Name"), n["Actual Rows"] + n.get("Rows Removed by Filter", 0))
            for n in scans]  # fmt: skip
    assert "jobs_type_status_id_idx" not in {name for name, _ in seen}, seen
    # (the limits' own reads, e.g. running jobs through jobs_lease_idx, are not the candidates')
    assert sum(read for name, read in seen if name == "jobs_pkey") <= 60, seen
