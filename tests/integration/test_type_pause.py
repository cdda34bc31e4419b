"""Pausing a job type fleet-wide (two workers): its jobs are accepted and wait in its queue,
PENDING, never delivered nor claimed (nothing spins); resuming runs them. Through the API and
the CLI; ``GET /types`` and ``conveyor types list`` show the flag."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import asyncpg

from conveyor.broker.inspect import Inspector
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings

from ..stack import running_stack, wait_for
from . import feature_apps as apps

CLI = [sys.executable, "-m", "conveyor.cli", "types"]


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONVEYOR_DATABASE_URL": settings.database_url}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=30)


async def test_a_paused_type_waits_on_every_worker_and_runs_on_resume(
    settings: Settings, db: asyncpg.Connection
) -> None:
    fast = settings.model_copy(update={"type_refresh_interval": 0.2})
    async with running_stack(fast, apps.router, workers=2, concurrency=4) as stack:
        r = await stack.client.post("/types/f_pausable/pause")
        assert r.status_code == 200 and r.json()["paused"] is True
        assert (await stack.client.post("/types/nope/pause")).status_code == 404
        await asyncio.sleep(0.6)  # three refreshes: both workers stopped consuming
        ids = [await stack.submit("f_pausable") for _ in range(10)]
        other = await stack.submit("f_child", {"of": "x"})  # other types keep running
        await wait_for(settings.database_url, [other], ["COMPLETED"])
        await asyncio.sleep(2.0)
        rows = await db.fetch(
            "SELECT status::text AS s, attempts FROM jobs WHERE id = ANY($1::uuid[])", ids
        )
        assert {(x["s"], x["attempts"]) for x in rows} == {("PENDING", 0)}
        inspector = Inspector(settings.amqp_url, Topology(settings.namespace), name="test")
        try:
            assert await inspector.queue_depth("f_pausable") == 10  # waiting in the queue
        finally:
            await inspector.close()
        for w in stack.workers:  # not spinning: no delivery reached a worker at all
            assert w.consumer.status().dropped_total == 0
            assert w.status().consuming  # still ready: the other types are consumed
        put = stack.client.put
        r = await put("/types/f_child/limits", json={"rate_limit": "5/30s", "concurrency": 2.0})
        assert r.status_code == 200 and r.json()["rate_limit"] == "5/30s", r.text
        r = await put("/types/f_child/limits", json={"concurrency": None})  # rate kept
        assert (r.json()["concurrency"], r.json()["rate_limit"]) == (None, "5/30s")
        assert r.json()["limits_source"] == "operator"
        assert (await put("/types/f_child/limits", content=b"{")).status_code == 400
        for bad in ({"rate_limit": "5/fortnight"}, {"concurrency": 0}, {"other": 1},
                    {"concurrency": True}, {"concurrency": 10_001}):  # fmt: skip
            assert (await put("/types/f_child/limits", json=bad)).status_code == 422, bad
        assert (await put("/types/nope/limits", json={})).status_code == 404
        listed = {t["name"]: t for t in (await stack.client.get("/types")).json()["types"]}
        assert listed["f_pausable"]["paused"] is True and listed["f_child"]["paused"] is False
        out = _cli(settings, "list")
        assert out.returncode == 0 and any(
            line.startswith("f_pausable") and "PAUSED" in line for line in out.stdout.splitlines()
        ), out.stdout
        out = _cli(settings, "limit", "f_child", "--concurrency", "10001")  # over the cap
        assert out.returncode != 0 and "from 1 to 10000" in out.stderr, out.stderr
        out = _cli(settings, "limit", "f_child", "--concurrency", "4", "--rate-limit", "none")
        assert out.returncode == 0 and "concurrency 4, rate limit -" in out.stdout, out.stderr
        out = _cli(settings, "resume", "f_pausable")
        assert out.returncode == 0 and "f_pausable: active," in out.stdout, out.stderr
        done = await wait_for(settings.database_url, ids, ["COMPLETED"], timeout=15)
        assert len(done) == 10

        # a limit admits (concurrency=1, two workers): nothing reaches a worker to be refused
        single = [await stack.submit("f_single") for _ in range(4)]
        await wait_for(settings.database_url, single, ["COMPLETED"], timeout=30)
        assert await db.fetchval(
            "SELECT max(attempts) FROM jobs WHERE job_type = 'f_single'"
        ) == 1  # fmt: skip
        assert await db.fetchval(
            "SELECT max(attempts) FROM jobs WHERE id = ANY($1::uuid[])", ids
        ) == 1  # fmt: skip
