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


# The poll (every 10 ms, the same on both sides of a comparison): of the ids in submission order,
# a window of ``WINDOW`` from the first not yet seen COMPLETED, each by its primary key; the
# window moves past the completed prefix. Jobs finish roughly in submission order, so a poll
# reads about ``WINDOW`` rows. It read every id not yet completed (up to 1,002 lookups, 3-6 ms
# of PostgreSQL per poll, a third of a core at 10 ms): more on the fan-out's side, whose ids stay
# open through the root and the release, so the harness took CPU from the side it measured. As
# ``id = ANY($1) AND status = 'COMPLETED'`` the planner may read every COMPLETED job of the
# table through ``jobs_done_idx`` and compare each with every id.
POLL = """
SELECT u.id FROM unnest($1::uuid[]) AS u(id)
WHERE (SELECT j.status FROM conveyor.jobs j WHERE j.id = u.id) = 'COMPLETED'
"""
WINDOW = 50

# Before each pair of turns on a server without autovacuum (this machine's runs with it off):
# what autovacuum does after every thousand-odd changed rows (migration 0009's thresholds), so
# that the statements' cached plans are made again for the table's size. Without it the
# worker's claims and completions kept plans made when the run's database was new and empty: a
# sequential scan of ``jobs`` each, a cost that grew with every turn (0.2 s of PostgreSQL CPU
# per 1,002 jobs in the first turn, 1.3 s in the fifteenth).
ANALYZE = "ANALYZE conveyor.jobs, conveyor.job_outbox, conveyor.job_dependencies"


async def _until_completed(conn: asyncpg.Connection, ids: list[uuid.UUID], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    first = 0  # ids[:first] are COMPLETED
    seen: set[uuid.UUID] = set()
    while True:
        window = [i for i in ids[first : first + WINDOW] if i not in seen]
        seen |= {r["id"] for r in await conn.fetch(POLL, window)}
        while first < len(ids) and ids[first] in seen:
            first += 1
        if first == len(ids):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{first} of {len(ids)} jobs COMPLETED in order after {timeout} s")
        await asyncio.sleep(0.01)


async def _workflow_ids(conn: asyncpg.Connection, workflow_id: uuid.UUID) -> list[uuid.UUID]:
    rows = await conn.fetch(  # about in submission order (UUIDv7: by the millisecond)
        "SELECT id FROM conveyor.jobs WHERE workflow_id = $1 ORDER BY id", workflow_id
    )
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
        analyze = await conn.fetchval("SHOW autovacuum") == "off"
        for _ in range(max(TURNS, repeat)):  # in turns: a disturbance hits both sides alike
            if analyze:
                await conn.execute(ANALYZE)
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
