"""The workflow workload (``bench.run``, after ``latency``): what waiting for other jobs costs.

- fan-out: a root, 1,000 no-op jobs after it and one job after all of them (``enqueue_workflow``
  in one transaction), against the same 1,002 jobs as a plain batch (``enqueue_many``): jobs/s
  from the commit to the last job COMPLETED, best of ``--repeat`` (at least ``TURNS``) each,
  taken in turns; the ratio is the target (>= 0.8).
- chain: 100 no-op jobs, each after the previous one: per link, the next job's ``started_at``
  minus the previous one's ``finished_at`` (the release, the relay, the broker, the claim), p50
  and p99; against 50 single jobs submitted one after another, ``started_at - created_at`` p50.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
import uuid
from typing import Any

import asyncpg

from conveyor import JobSpec, Workflow, chain, enqueue_many, enqueue_workflow

from .harness import Harness

FAN_OUT = 1000
CHAIN = 100
SINGLES = 50
# turns of each side at least: a turn takes about a second, and one disturbed turn out of two
# decided a best-of-two (runs of one side varied by a third on a shared two-core machine)
TURNS = 5


# The poll (every 10 ms, the same on both sides of a comparison): the ids not yet seen COMPLETED,
# each by its primary key. As ``id = ANY($1) AND status = 'COMPLETED'`` the planner may read
# every COMPLETED job of the table through ``jobs_done_idx`` and compare each with every id: a
# poll whose cost grows with the table and takes the CPU the jobs being measured need.
POLL = """
SELECT u.id FROM unnest($1::uuid[]) AS u(id)
WHERE (SELECT j.status FROM conveyor.jobs j WHERE j.id = u.id) = 'COMPLETED'
"""


async def _until_completed(conn: asyncpg.Connection, ids: list[uuid.UUID], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    left = set(ids)
    while True:
        left -= {r["id"] for r in await conn.fetch(POLL, list(left))}
        if not left:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(ids) - len(left)} of {len(ids)} jobs COMPLETED after {timeout} s"
            )
        await asyncio.sleep(0.01)


async def _workflow_ids(conn: asyncpg.Connection, workflow_id: uuid.UUID) -> list[uuid.UUID]:
    rows = await conn.fetch("SELECT id FROM conveyor.jobs WHERE workflow_id = $1", workflow_id)
    return [r["id"] for r in rows]


async def _plain(conn: asyncpg.Connection) -> tuple[float, dict[str, float]]:
    start = time.monotonic()
    async with conn.transaction():
        ids = await enqueue_many(conn, [JobSpec("noop") for _ in range(FAN_OUT + 2)])
    await _until_completed(conn, ids, 120)
    rate = (FAN_OUT + 2) / (time.monotonic() - start)
    phases = await conn.fetchrow(
        "SELECT min(started_at) - min(created_at) AS to_first,"
        " max(finished_at) - min(started_at) AS jobs FROM conveyor.jobs WHERE id = ANY($1)",
        ids,
    )
    return rate, {k: round(v.total_seconds() * 1000, 1) for k, v in phases.items()}


async def _fan_out(conn: asyncpg.Connection) -> tuple[float, dict[str, float]]:
    wf = Workflow("bench-fan-out")
    root = wf.add("root", "noop")
    leaves = [wf.add(f"leaf-{i}", "noop", after=[root]) for i in range(FAN_OUT)]
    wf.add("join", "noop", after=leaves)
    start = time.monotonic()
    async with conn.transaction():
        workflow_id = await enqueue_workflow(conn, wf)
    submitted = time.monotonic() - start
    await _until_completed(conn, await _workflow_ids(conn, workflow_id), 120)
    rate = (FAN_OUT + 2) / (time.monotonic() - start)
    phases = await conn.fetchrow(
        """SELECT
            max(started_at) FILTER (WHERE workflow_key = 'root') - min(created_at) AS to_root,
            min(started_at) FILTER (WHERE workflow_key LIKE 'leaf-%')
                - max(finished_at) FILTER (WHERE workflow_key = 'root') AS release,
            max(finished_at) FILTER (WHERE workflow_key LIKE 'leaf-%')
                - min(started_at) FILTER (WHERE workflow_key LIKE 'leaf-%') AS leaves,
            max(started_at) FILTER (WHERE workflow_key = 'join')
                - max(finished_at) FILTER (WHERE workflow_key LIKE 'leaf-%') AS to_join
        FROM conveyor.jobs WHERE workflow_id = $1""",
        workflow_id,
    )
    ms = {k: round(v.total_seconds() * 1000, 1) for k, v in phases.items()}
    return rate, {"submit_ms": round(submitted * 1000, 1), **ms}


def _ms(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


async def _chain(conn: asyncpg.Connection) -> dict[str, Any]:
    wf = chain(*[("noop", {"i": i}) for i in range(CHAIN)], name="bench-chain")
    start = time.monotonic()
    async with conn.transaction():
        workflow_id = await enqueue_workflow(conn, wf)
    await _until_completed(conn, await _workflow_ids(conn, workflow_id), 120)
    took = time.monotonic() - start
    rows = await conn.fetch(
        "SELECT started_at, finished_at FROM conveyor.jobs WHERE workflow_id = $1 "
        "ORDER BY started_at",
        workflow_id,
    )
    links = [
        (b["started_at"] - a["finished_at"]).total_seconds() for a, b in itertools.pairwise(rows)
    ]
    return {"link_ms_p50": _ms(links, 0.5), "link_ms_p99": _ms(links, 0.99),
            "seconds": round(took, 3)}  # fmt: skip


async def _singles(conn: asyncpg.Connection) -> float:
    waits = []
    for _ in range(SINGLES):
        async with conn.transaction():
            [job_id] = await enqueue_many(conn, [JobSpec("noop")])
        await _until_completed(conn, [job_id], 30)
        waits.append(
            await conn.fetchval(
                "SELECT extract(epoch FROM started_at - created_at)::float8 "
                "FROM conveyor.jobs WHERE id = $1",
                job_id,
            )
        )
    return _ms(waits, 0.5)


async def run(h: Harness, repeat: int) -> dict[str, Any]:
    conn = await asyncpg.connect(h.db_url)
    try:
        plain: list[float] = []
        fan: list[float] = []
        phases: list[dict[str, float]] = []
        plain_phases: list[dict[str, float]] = []
        for _ in range(max(TURNS, repeat)):  # in turns: a disturbance hits both sides alike
            rate, timeline = await _plain(conn)
            plain.append(rate)
            plain_phases.append(timeline)
            rate, timeline = await _fan_out(conn)
            fan.append(rate)
            phases.append(timeline)
        chained = await _chain(conn)
        single = await _singles(conn)
    finally:
        await conn.close()
    best_plain, best_fan = max(plain), max(fan)
    return {
        "fan_out_jobs": FAN_OUT + 2,
        "fan_out_jobs_per_s": round(best_fan, 1),
        "plain_batch_jobs_per_s": round(best_plain, 1),
        "fan_out_vs_plain": round(best_fan / best_plain, 3),
        "fan_out_runs": [round(r, 1) for r in fan],
        "plain_runs": [round(r, 1) for r in plain],
        "median_ratio": round(statistics.median(fan) / statistics.median(plain), 3),
        # the best fan-out's timeline: submit, to the root's start, its finish to the first
        # leaf's start (the release), the leaves, the last leaf's finish to the join's start
        "fan_out_phases_ms": phases[fan.index(best_fan)],
        "plain_phases_ms": plain_phases[plain.index(best_plain)],  # to the first start, jobs
        "chain_links": CHAIN,
        **{f"chain_{k}": v for k, v in chained.items()},
        "single_submit_to_start_ms_p50": single,
    }
