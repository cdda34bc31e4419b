"""The gauge refresh's cost is bounded by the number of (type, status) pairs, not by the backlog
(an exact count reads 600,000 rows, ~1 s at 10 million jobs, every 5 s). On a million
generated jobs (``plans.generate``: each live status is ~3,300 rows in three of the 12 types)
every statement of ``Gauges.refresh_once`` is run under EXPLAIN ANALYZE with the arguments it
was called with: no sequential scan of ``jobs``, no scan of ``jobs`` returning more than the
exact-count cap per loop, and no more than the cap per (type, status) in all. The counts are
exact below the cap and the planner's estimate above it (within a factor of two of the truth
here), and ``conveyor_jobs_estimated`` says which. The same for the workflows by status: each
status counted up to the cap, not every finished workflow of the retention window."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import asyncpg
import pytest

from conveyor import JobSpec, enqueue_many
from conveyor.broker.topology import Topology
from conveyor.core.metrics import Metrics
from conveyor.maintenance.gauges import Gauges
from conveyor.store import for_schema
from conveyor.store.connect import create_pool

from .plans import generate

ROWS = int(os.environ.get("CONVEYOR_EXPLAIN_ROWS", "1000000"))
CAP = 1000  # the refresh counts each (type, status) exactly up to this many rows


class Recording:
    """A connection that notes every query it runs (SQL and arguments)."""

    def __init__(self, conn: Any, seen: list[tuple[str, tuple[Any, ...]]]) -> None:
        self._conn, self._seen = conn, seen

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._conn, name)
        if name not in ("fetch", "fetchrow", "fetchval", "execute"):
            return method

        async def run(sql: str, *args: Any, **kw: Any) -> Any:
            self._seen.append((sql, args))
            return await method(sql, *args, **kw)

        return run


class RecordingPool:
    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    def acquire(self) -> Any:
        pool, seen = self.pool, self.seen

        class Ctx:
            async def __aenter__(self) -> Recording:
                self.cm = pool.acquire()
                return Recording(await self.cm.__aenter__(), seen)

            async def __aexit__(self, *exc: Any) -> None:
                await self.cm.__aexit__(*exc)

        return Ctx()


def nodes(plan: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(plan, dict):
        if "Node Type" in plan:
            found.append(plan)
        for v in plan.values():
            found += nodes(v)
    elif isinstance(plan, list):
        for v in plan:
            found += nodes(v)
    return found


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


@pytest.mark.timeout(600)
async def test_gauge_refresh_is_bounded_on_a_million_jobs(
    db: asyncpg.Connection, db_url: str
) -> None:
    await generate(db, ROWS, workflow_every=5)  # 1 job in 5 in a workflow of 10
    # a type below the cap in every status it has: counted exactly (not in the statistics yet)
    await enqueue_many(db, [JobSpec("ghost")] * 7 + [JobSpec("ghost", delay_seconds=600)] * 2)
    await db.execute("UPDATE jobs SET status = 'FAILED' WHERE id IN (SELECT id FROM jobs "
                     "WHERE job_type = 'ghost' AND status = 'PENDING' LIMIT 3)")  # fmt: skip
    truth = {
        (r["job_type"], r["status"]): r["n"]
        for r in await db.fetch(
            "SELECT job_type, status::text AS status, count(*) AS n FROM jobs"
            " WHERE status NOT IN ('COMPLETED', 'CANCELLED') GROUP BY 1, 2"
        )
    }
    assert truth[("ghost", "PENDING")] == 4 and truth[("type_1", "PENDING")] > 2 * CAP

    metrics = Metrics()
    pool = await create_pool(db_url, application_name="test-gauges", max_size=2)
    try:
        recording = RecordingPool(pool)
        gauges = Gauges(metrics, for_schema(), recording, Topology("t"))
        await gauges.refresh_once()  # warm
        t = time.perf_counter()
        await gauges.refresh_once()
        print(f"gauge refresh: {(time.perf_counter() - t) * 1000:.1f} ms at {ROWS:,} rows")
    finally:
        await pool.close()

    # the cost: every statement the refresh ran, under EXPLAIN ANALYZE with its arguments
    # (the rows of every scan of ``jobs``, over all its loops: at most the cap per pair, plus a
    # probe per type and status; counting the backlog exactly reads all of it)
    assert recording.seen
    read = flows_read = 0
    for sql, args in {(s, a) for s, a in recording.seen}:
        if sql.lstrip().upper().startswith("EXPLAIN"):
            continue  # planning only: reads no rows
        plan = json.loads(await db.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args))
        for node in nodes(plan):
            if node.get("Relation Name") == "workflows":
                flows_read += node["Actual Rows"] * node["Actual Loops"]
            if node.get("Relation Name") != "jobs":
                continue
            where = f"{node['Node Type']} on {node.get('Index Name', 'jobs')} in {sql}"
            assert node["Node Type"] != "Seq Scan", where
            assert node["Actual Rows"] <= CAP, f"{node['Actual Rows']} rows a loop: {where}"
            read += node["Actual Rows"] * node["Actual Loops"]
    backlog = sum(truth.values())
    print(f"rows read from jobs: {read:,} (backlog {backlog:,}, {len(truth)} pairs)")
    assert read <= CAP * len(truth) + 1000, (read, backlog)
    # the workflows: each status stopped at the cap, not every workflow counted
    flows = await db.fetchval("SELECT count(*) FROM workflows")
    print(f"rows read from workflows: {flows_read:,} (of {flows:,})")
    assert flows > 4 * CAP and flows_read <= 4 * CAP, (flows_read, flows)

    # the counts: exact below the cap, the planner's estimate (flagged) above it
    for (job_type, status), n in truth.items():
        got = _value(metrics, "conveyor_jobs", type=job_type, status=status)
        estimated = _value(metrics, "conveyor_jobs_estimated", type=job_type, status=status)
        assert got is not None, (job_type, status)
        if n < CAP:
            assert (got, estimated) == (n, 0), (job_type, status, n, got)
        else:
            assert estimated == 1, (job_type, status)
            assert got >= CAP and n / 2 <= got <= 2 * n, (job_type, status, n, got)
    assert _value(metrics, "conveyor_jobs", type="ghost", status="FAILED") == 3
