"""Workflows under real concurrency and crashes: a fan-in whose hundreds of parents finish at the
same instant on three worker processes releases its child exactly once, after every parent; so
does every release while workers are SIGKILLed and the relay process dies between publish
confirms and the outbox delete. The audit trigger (checker.py) records every status change of
every job with its clock time: the evidence."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conveyor import Workflow, enqueue_workflow
from conveyor.core.config import Settings

from .. import db as tdb
from .checker import Ledger
from .harness import Proc, WorkerFleet, component_env, running, wait_until


async def _submit(db_url: str, workflows: list[Workflow]) -> list[uuid.UUID]:
    conn = await tdb.connect(db_url, timeout=10)
    try:
        out = []
        for wf in workflows:
            async with conn.transaction():
                out.append(await enqueue_workflow(conn, wf))
        return out
    finally:
        await conn.close()


async def _all_finished(db_url: str, ids: list[uuid.UUID]) -> bool:
    conn = await tdb.connect(db_url, timeout=10)
    try:
        n = await conn.fetchval(
            "SELECT count(*) FROM workflows WHERE id = ANY($1::uuid[]) AND status <> 'RUNNING'",
            ids,
        )
        return bool(n == len(ids))
    finally:
        await conn.close()


async def check_releases(db_url: str, ids: list[uuid.UUID], ledger: Ledger) -> dict[str, Any]:
    """Every job with dependencies: released (WAITING -> PENDING/SCHEDULED) exactly once, after
    the last of its dependencies completed; started only after that; completed. Every workflow
    COMPLETED. Returns figures for the report."""
    conn = await tdb.connect(db_url, timeout=10)
    try:
        wf = dict(await conn.fetch("SELECT id, status FROM workflows WHERE id = ANY($1)", ids))
        assert set(wf.values()) == {"COMPLETED"}, wf
        rows = await conn.fetch(
            """
            SELECT j.id, j.workflow_key, j.status::text AS status, j.started_at,
                   (SELECT count(*) FROM public.fault_audit a WHERE a.job_id = j.id
                      AND a.old_status = 'WAITING' AND a.new_status <> 'CANCELLED') AS releases,
                   (SELECT min(a.at) FROM public.fault_audit a WHERE a.job_id = j.id
                      AND a.old_status = 'WAITING') AS released_at,
                   (SELECT max(a.at) FROM public.fault_audit a
                      JOIN job_dependencies d ON d.depends_on = a.job_id
                      WHERE d.job_id = j.id AND a.new_status = 'COMPLETED') AS parents_done,
                   (SELECT count(*) FROM job_dependencies d JOIN jobs p ON p.id = d.depends_on
                      WHERE d.job_id = j.id AND p.status <> 'COMPLETED') AS unmet,
                   (SELECT min(a.at) FROM public.fault_audit a WHERE a.job_id = j.id
                      AND a.new_status = 'IN_PROGRESS') AS first_start
            FROM jobs j
            WHERE j.workflow_id = ANY($1)
              AND EXISTS (SELECT 1 FROM job_dependencies d WHERE d.job_id = j.id)
            """,
            ids,
        )
        assert rows
        for r in rows:
            assert r["status"] == "COMPLETED", dict(r)
            assert r["releases"] == 1, dict(r)
            assert r["unmet"] == 0
            assert r["released_at"] >= r["parents_done"], dict(r)
            assert r["first_start"] >= r["released_at"], dict(r)
        lag = max((r["released_at"] - r["parents_done"]).total_seconds() for r in rows)
        return {"released": len(rows), "max_release_lag_ms": round(lag * 1000, 1)}
    finally:
        await conn.close()


def _fan_in(name: str, parents: int, ledger: Ledger) -> Workflow:
    wf = Workflow(name)
    keys = [wf.add(f"p{i}", "work", {"ledger": str(ledger), "sleep": 0}) for i in range(parents)]
    wf.add("child", "work", {"ledger": str(ledger), "sleep": 0}, after=keys)
    return wf


@pytest.mark.timeout(240)
async def test_fan_in_across_three_worker_processes_releases_once(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """Three runs of three fan-ins of 200 parents each on three worker processes (batched
    completions: many parents of one child complete in the same instant on different
    workers): each child is released once, after its last parent, and runs once."""
    async with running(fsettings):
        fleet = WorkerFleet(fsettings, tmp_path, 3, concurrency=16)
        await fleet.ready()
        figures = []
        try:
            for run in range(3):
                ids = await _submit(
                    fsettings.database_url,
                    [_fan_in(f"fan-in-{run}-{k}", 200, ledger) for k in range(3)],
                )
                await wait_until(
                    lambda ids=ids: _all_finished(fsettings.database_url, ids),  # type: ignore[misc]
                    timeout=90, interval=0.3, what="the fan-ins finished",
                )  # fmt: skip
                figures.append(await check_releases(fsettings.database_url, ids, ledger))
        finally:
            await fleet.stop()
    pids = {e.pid for e in ledger.entries()}
    assert len(pids) >= 2, "the parents ran on more than one worker process"
    children = await _children(fsettings.database_url)
    for child in children:
        assert ledger.count("start", child) == 1
    print(f"[faults] fan-in x3 processes: {figures} on {len(pids)} worker pids")


async def _children(db_url: str) -> list[uuid.UUID]:
    conn = await tdb.connect(db_url, timeout=10)
    try:
        rows = await conn.fetch("SELECT DISTINCT job_id FROM job_dependencies")
        return [r["job_id"] for r in rows]
    finally:
        await conn.close()


def _mixed(name: str, ledger: Ledger, rng: random.Random) -> Workflow:
    """A fan-out, a fan-in, then a chain: releases of every shape."""
    payload = {"ledger": str(ledger), "sleep": 0.02}
    wf = Workflow(name)
    root = wf.add("root", "work", payload)
    mids = [wf.add(f"m{i}", "work", payload, after=[root]) for i in range(rng.randint(20, 60))]
    last = wf.add("join", "work", payload, after=mids)
    for i in range(5):
        last = wf.add(f"c{i}", "work", payload, after=[last])
    return wf


@pytest.mark.timeout(300)
async def test_releases_survive_sigkilled_workers_and_a_dying_relay(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """Worker processes SIGKILLed about every 0.7 s (mid-handler, mid-completion batch: the
    completion and its release commit together or not at all) and a relay process that dies
    between publish confirms and the outbox delete (p=0.3; released jobs' rows published
    twice): every release happens exactly once, never before its dependencies completed, and
    every workflow completes."""
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    rng = random.Random(seed)
    stop = asyncio.Event()
    crashes = 0

    def publisher(p: float) -> Proc:
        env = component_env(fsettings, FAULTS_CRASH_P=str(p))
        return Proc("crashing-publisher", [sys.executable, "-m", "tests.faults.crashing_publisher"],
                    env, tmp_path).start()  # fmt: skip

    relay = publisher(0.3)

    async def supervise_relay() -> None:
        nonlocal crashes, relay
        while not stop.is_set():
            if not relay.alive():
                crashes += 1
                relay = publisher(0.3 if crashes < 10 else 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    async with running(fsettings, relays=0):
        fleet = WorkerFleet(fsettings, tmp_path, 3, concurrency=8)
        await fleet.ready()
        tasks = [asyncio.create_task(fleet.supervise(stop)), asyncio.create_task(supervise_relay())]

        async def killer() -> None:
            while not stop.is_set() and fleet.kills < 12:
                await asyncio.sleep(rng.uniform(0.4, 1.0))
                await fleet.kill_one(rng)

        tasks.append(asyncio.create_task(killer()))
        try:
            ids = await _submit(
                fsettings.database_url, [_mixed(f"mixed-{k}", ledger, rng) for k in range(6)]
            )
            await wait_until(
                lambda: _all_finished(fsettings.database_url, ids),
                timeout=150, interval=0.5, what="every workflow finished",
            )  # fmt: skip
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await fleet.stop()
            await relay.stop()
    figures = await check_releases(fsettings.database_url, ids, ledger)
    print(f"[faults] workflows under kills (seed {seed}): {figures}, {fleet.kills} worker kills,"
          f" {crashes} relay crashes")  # fmt: skip
