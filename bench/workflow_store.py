"""What a workflow job costs the store, statement by statement (a timing script, not a test):
the claim and the completion of a plain job, of a chain's link (its completion releases the next
link) and of a fan-out's leaf (its completion counts the fan-in down), in turns, on a database
of its own, from the client's clock (each statement in its own transaction, commit included);
and a single job's submit (``enqueue_many`` in a transaction), the part of a submit→start
latency a link's completion stands for.

    .venv/bin/python -m bench.workflow_store [--rounds 250] [--backlog 6000] [--explain]

Prints the medians (ms) and, with ``--explain``, then the plans of the statements the triggers
run for one chain link's completion (auto_explain, nested statements, in this session only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any

import asyncpg

from conveyor import JobSpec, Workflow, chain, enqueue_many, enqueue_workflow
from conveyor.store import Completion, Store

from .db import noop_database

CLAIM = {
    "lease_seconds": 60.0,
    "worker_id": "timing",
    "types": ["noop"],
    "handler_defaults": {},
    "default_max_retries": 3,
}


async def _claim_complete(
    store: Store, conn: asyncpg.Connection, job_id: uuid.UUID
) -> tuple[float, float]:
    t0 = time.perf_counter()
    [job] = await store.job_claim_many(conn, [job_id], **CLAIM)
    t1 = time.perf_counter()
    done = await store.job_complete_many(conn, [Completion(job_id, job.attempts, None)])
    t2 = time.perf_counter()
    assert done == {job_id}
    return t1 - t0, t2 - t1


def _link(key: str) -> int:
    """A chain's link number from its key: ``noop``, ``noop-2``, ``noop-3``..."""
    _, _, n = key.partition("-")
    return int(n) if n else 1


async def _keys(conn: asyncpg.Connection, workflow_id: uuid.UUID) -> dict[str, uuid.UUID]:
    rows = await conn.fetch(
        "SELECT workflow_key, id FROM conveyor.jobs WHERE workflow_id = $1", workflow_id
    )
    return {r["workflow_key"]: r["id"] for r in rows}


# Finished jobs already in the table (a run's earlier workloads), never analyzed: the benchmark's
# database runs with autovacuum off.
BACKLOG = """
INSERT INTO conveyor.jobs (id, job_type, status, priority, payload, created_at, updated_at,
                           started_at, finished_at, attempts)
SELECT gen_random_uuid(), 'noop', 'COMPLETED', 5, '{}'::jsonb, now(), now(), now(), now(), 1
FROM generate_series(1, $1)
"""


async def measure(url: str, rounds: int, backlog: int) -> dict[str, Any]:
    store = Store()
    conn = await asyncpg.connect(url)
    times: dict[str, list[float]] = {}
    try:
        await conn.execute(BACKLOG, backlog)
        # the chain: its first link claimed and completed first, then one link per round
        async with conn.transaction():
            links = await enqueue_workflow(
                conn, chain(*[("noop", {"i": i}) for i in range(rounds + 2)], name="chain")
            )
        chain_keys = await _keys(conn, links)
        chain_ids = [chain_keys[k] for k in sorted(chain_keys, key=_link)]
        wf = Workflow("fan")
        root = wf.add("root", "noop")
        for i in range(rounds):
            wf.add(f"leaf-{i}", "noop", after=[root])
        wf.add("join", "noop", after=[f"leaf-{i}" for i in range(rounds)])
        async with conn.transaction():
            fan = await enqueue_workflow(conn, wf)
        fan_keys = await _keys(conn, fan)
        await _claim_complete(store, conn, chain_ids[0])
        await _claim_complete(store, conn, fan_keys["root"])
        for i in range(rounds):
            t0 = time.perf_counter()
            async with conn.transaction():
                [plain] = await enqueue_many(conn, [JobSpec("noop")])
            times.setdefault("plain_submit", []).append(time.perf_counter() - t0)
            for name, job_id in (
                ("plain", plain),
                ("link", chain_ids[i + 1]),
                ("leaf", fan_keys[f"leaf-{i}"]),
            ):
                claim, complete = await _claim_complete(store, conn, job_id)
                times.setdefault(f"{name}_claim", []).append(claim)
                times.setdefault(f"{name}_complete", []).append(complete)
        status = await conn.fetchval("SELECT status FROM conveyor.workflows WHERE id = $1", links)
        assert status == "RUNNING", status  # the last link is left WAITING or PENDING
    finally:
        await conn.close()
    return {k: round(statistics.median(v) * 1000, 3) for k, v in times.items()}


async def explain(url: str) -> None:
    """One chain link's completion under auto_explain: the trigger statements' plans."""
    store = Store()
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            wf_id = await enqueue_workflow(conn, chain(("noop", {}), ("noop", {}), ("noop", {})))
        keys = await _keys(conn, wf_id)
        ordered = [keys[k] for k in sorted(keys, key=_link)]
        await _claim_complete(store, conn, ordered[0])
        [job] = await store.job_claim_many(conn, [ordered[1]], **CLAIM)
        await conn.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_timing = on",
            "auto_explain.log_buffers = on",
            "client_min_messages = log",
            "auto_explain.log_level = notice",
        ):
            await conn.execute(f"SET {setting}")
        conn.add_log_listener(lambda _c, msg: print(msg.message, "\n"))
        await store.job_complete_many(conn, [Completion(ordered[1], job.attempts, None)])
        await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=250)
    parser.add_argument(
        "--url", default=os.environ.get("CONVEYOR_DATABASE_URL", "postgresql://postgres@127.0.0.1/")
    )
    parser.add_argument("--database", default=f"conveyor_wf_timing_{os.getpid()}")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--backlog", type=int, default=6000, help="finished jobs first (6000)")
    args = parser.parse_args()
    async with noop_database(args.url, args.database) as url:
        print(await measure(url, args.rounds, args.backlog))
        if args.explain:
            await explain(url)


if __name__ == "__main__":
    asyncio.run(main())
