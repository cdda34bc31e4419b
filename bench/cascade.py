"""What a workflow's cascades cost (a timing script, not a test): on a database of its own, a
deep chain and a wide fan-out each have their root fail for good, which cancels every job
downstream; then the root is redriven, which brings them back to WAITING; and a workflow of that
size is cancelled whole. Each figure is one statement from the client's clock, commit included.

    .venv/bin/python -m bench.cascade [--jobs 10000] [--shape chain|fan_out]

The target: each within 5 s for 10,000 jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from conveyor import Workflow, chain, enqueue_workflow
from conveyor.store import Failure, Store

from .db import noop_database

CLAIM = {
    "lease_seconds": 60.0,
    "worker_id": "timing",
    "types": ["noop"],
    "handler_defaults": {},
    "default_max_retries": 0,
}


def _fan_out(n: int) -> Workflow:
    wf = Workflow("fan", on_failure="cancel")
    root = wf.add("root", "noop", max_retries=0)
    leaves = [wf.add(f"leaf-{i}", "noop", after=[root]) for i in range(n - 2)]
    wf.add("join", "noop", after=leaves)
    return wf


async def _timed(what: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await what()
    return round(time.perf_counter() - t0, 3)


async def _shape(store: Store, conn: asyncpg.Connection, wf: Workflow) -> dict[str, float]:
    async with conn.transaction():
        wid = await enqueue_workflow(conn, wf)
    root: uuid.UUID = await conn.fetchval(
        "SELECT id FROM conveyor.jobs WHERE workflow_id = $1 AND deps_pending = 0", wid
    )
    [job] = await store.job_claim_many(conn, [root], **CLAIM)
    failed = await _timed(
        lambda: store.job_fail_many(conn, [Failure(root, job.attempts, "boom", None)])
    )
    counts = dict(await conn.fetch(
        "SELECT status::text, count(*) FROM conveyor.jobs WHERE workflow_id = $1 GROUP BY 1", wid
    ))  # fmt: skip
    assert counts == {"FAILED": 1, "CANCELLED": len(wf.nodes) - 1}, counts
    redriven = await _timed(lambda: store.job_redrive(conn, [root]))
    waiting = await conn.fetchval(
        "SELECT count(*) FROM conveyor.jobs WHERE workflow_id = $1 AND status = 'WAITING'", wid
    )
    assert waiting == len(wf.nodes) - 1, waiting
    cancelled = await _timed(lambda: store.workflow_cancel(conn, wid))
    return {"fail_s": failed, "redrive_s": redriven, "cancel_workflow_s": cancelled}


def _chain(n: int) -> Workflow:
    return chain(*[("noop", {"i": i}, {"max_retries": 0}) for i in range(n)], name="deep")


SHAPES = {"chain": _chain, "fan_out": _fan_out}


async def measure(url: str, n: int, shapes: list[str]) -> dict[str, dict[str, float]]:
    store = Store()
    conn = await asyncpg.connect(url)
    try:
        return {f"{shape}_{n}": await _shape(store, conn, SHAPES[shape](n)) for shape in shapes}
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--url", default=os.environ.get("CONVEYOR_DATABASE_URL", "postgresql://postgres@127.0.0.1/")
    )
    parser.add_argument("--database", default=f"conveyor_cascade_{os.getpid()}")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", help="(both)")
    args = parser.parse_args()
    async with noop_database(args.url, args.database) as url:
        print(await measure(url, args.jobs, args.shape or list(SHAPES)))


if __name__ == "__main__":
    asyncio.run(main())
