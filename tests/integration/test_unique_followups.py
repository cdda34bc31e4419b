"""A handler's unique follow-up whose key an application's open transaction holds (an
uncommitted job with that key) waits for that transaction, as a submit would: the wait must
stay with that one completion. The other jobs' outcomes on the worker are written meanwhile, the
worker stays live, and when the application commits (the follow-up is a duplicate) or rolls
back (the follow-up is inserted), the completion and its follow-up commit together."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import httpx

from conveyor import Job, JobRouter, JobSpec, enqueue, enqueue_many
from conveyor.core.config import Settings
from conveyor.worker.health import serve_health

from .. import db as tdb
from ..stack import free_port, running_stack, wait_for

router = JobRouter()
NEIGHBOURS = 40
DEADLINE = 3.0  # worker_outcome_deadline: a stalled outcome writer fails liveness after it


@router.job("uf_parent", max_retries=0)
async def uf_parent(job: Job) -> str:
    key = job.payload["key"]
    return str(job.enqueue("uf_child", {"from": key}, unique_for=300, unique_key=key))


@router.job("uf_child")
async def uf_child(job: Job) -> None:
    return None


@router.job("uf_neighbour")
async def uf_neighbour(job: Job) -> None:
    return None


async def _healthz(port: int) -> tuple[int, Any]:
    async with httpx.AsyncClient(timeout=2) as c:
        r = await c.get(f"http://127.0.0.1:{port}/healthz")
        return r.status_code, r.json()


async def test_a_unique_follow_up_held_by_an_open_transaction_stalls_only_its_job(
    settings: Settings, db_url: str, db: asyncpg.Connection
) -> None:
    s = settings.model_copy(update={"worker_outcome_deadline": DEADLINE})
    apps = [await tdb.connect(db_url) for _ in range(2)]
    txs = [a.transaction() for a in apps]
    async with running_stack(s, router, concurrency=8) as stack:
        worker = stack.workers[0]
        port = free_port()
        server = await serve_health(worker, "127.0.0.1", port)
        try:
            for i, (app, tx) in enumerate(zip(apps, txs, strict=True)):
                await tx.start()  # the application's transaction: a job holding key-<i>, open
                await enqueue(app, "uf_child", {"app": i}, unique_for=300, unique_key=f"key-{i}")
            parents = [await stack.submit("uf_parent", {"key": f"key-{i}"}) for i in range(2)]
            deadline = time.monotonic() + 20
            while worker.completer.status().waiting < 2:  # both parents have returned
                assert time.monotonic() < deadline, "the parents never returned"
                await asyncio.sleep(0.02)
            started = time.monotonic()
            codes: list[int] = []
            probe = asyncio.create_task(_probe(port, codes))
            ids = await enqueue_many(db, [JobSpec("uf_neighbour", {"i": i})
                                          for i in range(NEIGHBOURS)])  # fmt: skip
            done = await _count_completed(db_url, ids, timeout=15)
            took = time.monotonic() - started
            await asyncio.sleep(max(0.0, started + DEADLINE + 1.5 - time.monotonic()))
            probe.cancel()
            states = await wait_for(db_url, parents, ["IN_PROGRESS", "COMPLETED"], timeout=1)
            held = worker.completer.status().held
            print(f"[unique follow-ups] neighbours completed {done}/{NEIGHBOURS} in {took:.1f} s; "
                  f"/healthz {sorted(set(codes))}; parents {sorted(states.values())}, "
                  f"held {held}")  # fmt: skip
            assert done == NEIGHBOURS, f"{done} of {NEIGHBOURS} neighbour jobs completed in 15 s"
            assert set(codes) == {200}, "liveness failed while one follow-up waited on a key"
            assert sorted(states.values()) == ["IN_PROGRESS", "IN_PROGRESS"]  # waiting, not lost
            assert held == 2
            await txs[0].commit()  # key-0 is the application's: that follow-up is a duplicate
            await txs[1].rollback()  # key-1 is free again: that follow-up is inserted
            states = await wait_for(db_url, parents, ["COMPLETED", "FAILED"], timeout=20)
            assert set(states.values()) == {"COMPLETED"}
        finally:
            for a in apps:
                await a.close()
            server.close()
    children = await db.fetch(
        "SELECT payload::text AS p, status::text AS s FROM jobs WHERE job_type = 'uf_child' "
        "ORDER BY p"
    )
    assert [r["p"] for r in children] == ['{"app": 0}', '{"from": "key-1"}']
    holders = await db.fetch("SELECT key, job_id FROM job_uniques ORDER BY key")
    assert len(holders) == 2
    assert await db.fetchval("SELECT count(*) FROM jobs") == NEIGHBOURS + 2 + 2


async def _probe(port: int, codes: list[int]) -> None:
    """``/healthz`` every 0.1 s until cancelled (the worker's probe thread answers it)."""
    while True:
        codes.append((await _healthz(port))[0])
        await asyncio.sleep(0.1)


async def _count_completed(db_url: str, ids: list[uuid.UUID], timeout: float) -> int:
    conn = await tdb.connect(db_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            n = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'COMPLETED'", ids
            )
            if n == len(ids) or time.monotonic() > deadline:
                return int(n)
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
