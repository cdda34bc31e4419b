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
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from conveyor import Workflow, enqueue_workflow
from conveyor.core.config import Settings

from .. import db as tdb
from .checker import Ledger, check
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
                      AND a.new_status = 'IN_PROGRESS') AS first_start,
                   -- claimed in the transaction that released it, by the completing worker
                   EXISTS (SELECT 1 FROM public.fault_audit a JOIN public.fault_audit b
                             ON b.job_id = a.job_id AND b.xact = a.xact
                           WHERE a.job_id = j.id AND a.old_status = 'WAITING'
                             AND b.new_status = 'IN_PROGRESS') AS followed,
                   j.attempts
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
        followed = [r for r in rows if r["followed"]]
        return {
            "released": len(rows),
            "max_release_lag_ms": round(lag * 1000, 1),
            "run_by_the_releasing_worker": len(followed),
            "of_those_run_again": sum(1 for r in followed if r["attempts"] > 1),
        }
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
    # the kills met jobs claimed by the worker that released them too (worker/follow.py)
    assert figures["run_by_the_releasing_worker"] > 0, figures


# --------------------------------------------------------------------------- paused processes

IDLE_BOUND = 5.0  # CONVEYOR_DB_IDLE_IN_TRANSACTION_TIMEOUT's default (store/bounds.py)
LOCK_BOUND = 10.0  # CONVEYOR_DB_LOCK_TIMEOUT's default


def _pausing(settings: Settings, tmp_path: Path, name: str, flag: Path, statement: str,
             *argv: str) -> Proc:  # fmt: skip
    """``conveyor ARGV`` frozen inside its first transaction that ran ``statement``
    (``pausing_statement.py``)."""
    args = [sys.executable, "-m", "tests.faults.pausing_statement", str(flag), statement, "--"]
    return Proc(name, [*args, *argv], component_env(settings), tmp_path).start()


async def _frozen(procs: list[Proc], timeout: float) -> Proc:
    """The process whose log says it froze."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if "pausing_statement: frozen" in p.log():
                return p
        await asyncio.sleep(0.01)
    raise AssertionError("no process froze:\n" + "\n".join(p.log()[-1500:] for p in procs))


class Timeline:
    """Seconds from the freeze, sampled every 50 ms: the frozen session's end, the most
    sessions seen waiting on a lock at once, and when each watched condition first held."""

    def __init__(self, conn: Any, frozen_pid: int | None) -> None:
        self.conn = conn
        self.frozen_pid = frozen_pid
        self.t0 = time.monotonic()
        self.ended: float | None = None
        self.lock_waiters = 0
        self.seen: dict[str, float] = {}

    async def watch(self, checks: dict[str, str], timeout: float) -> None:
        """Until every ``checks`` query (a boolean) held once, or ``timeout``."""
        while time.monotonic() - self.t0 < timeout:
            now = round(time.monotonic() - self.t0, 2)
            waiting = await self.conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            self.lock_waiters = max(self.lock_waiters, int(waiting))
            if (
                self.ended is None
                and self.frozen_pid is not None
                and not await self.conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", self.frozen_pid
                )
            ):
                self.ended = now
            for name, query in checks.items():
                if name not in self.seen and await self.conn.fetchval(query):
                    self.seen[name] = now
            if len(self.seen) == len(checks) and (self.ended or self.frozen_pid is None):
                return
            await asyncio.sleep(0.05)


async def _locked(conn: Any, job_id: uuid.UUID) -> bool:
    """Whether another transaction holds the job's row lock."""
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE NOWAIT", job_id)
    except asyncpg.LockNotAvailableError:
        return True
    return False


async def _idle_backend(conn: Any, within: float = 3.0) -> int:
    """The backend of the frozen transaction (``idle in transaction`` for 0.3 s or more)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pid = await conn.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state = "
            "'idle in transaction' AND state_change < clock_timestamp() - interval '0.3 s' "
            "ORDER BY state_change LIMIT 1"
        )
        if pid is not None:
            return int(pid)
        await asyncio.sleep(0.05)
    raise AssertionError("no session idle in transaction")


@pytest.mark.timeout(120)
async def test_a_worker_frozen_releasing_a_fan_in_child_wedges_no_one(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """Three worker processes, each wrapped by ``pausing_statement``: the one that completes
    the fan-in's quick parent ``p0`` (its completion written in a transaction, beside a
    follow-up) freezes just after the statement whose trigger counted the child down and locked
    its row. The other parents, held back by a gate file the test opens once the worker froze,
    then complete on the other workers: their
    completion statements wait on the child's row lock only until PostgreSQL ends the frozen
    session (idle in transaction, 5 s), which rolls p0's completion back; the sweeper recovers
    the frozen worker's jobs at their lease, another worker runs p0 again, and the child is
    released once and runs once. After SIGCONT the frozen worker's late writes are fenced.

    The fault tests' lease is 2 s, well under the idle bound: the healthy workers' heartbeats
    skip the rows their own blocked completion batch holds instead of waiting behind it, so the
    rest of their running jobs keep their leases. Only the frozen worker's jobs run twice."""
    flag = tmp_path / "freeze"
    flag.touch()  # empty: the first completion written in a transaction
    wf = Workflow("fan-in-frozen")
    gate = tmp_path / "go"
    slow = {"ledger": str(ledger), "sleep": 0.2, "gate": str(gate)}
    parents = [wf.add("p0", "work", {"ledger": str(ledger), "sleep": 0, "followup": "work"})]
    parents += [wf.add(f"p{i}", "work", slow) for i in range(1, 12)]
    wf.add("child", "work", {"ledger": str(ledger), "sleep": 0}, after=parents)
    argv = ("worker", "--app", "tests.faults.apps:router", "--concurrency", "4")
    async with running(fsettings):
        procs = [_pausing(fsettings, tmp_path, f"worker-{i}", flag, "job_complete_many", *argv)
                 for i in range(3)]  # fmt: skip
        conn = await tdb.connect(fsettings.database_url, timeout=10)
        try:
            for p in procs:
                await p.wait_for_log("worker_started", 30)
            (wf_id,) = await _submit(fsettings.database_url, [wf])
            victim = await _frozen(procs, timeout=30)
            timeline = Timeline(conn, None)
            gate.touch()  # the siblings finish now, racing the frozen transaction
            frozen_pid = int(victim.log().split("pid=")[1].split()[0])
            timeline.frozen_pid = await _idle_backend(conn)
            ids = dict(await conn.fetch(
                "SELECT workflow_key, id FROM jobs WHERE workflow_id = $1", wf_id))  # fmt: skip
            siblings = [ids[f"p{i}"] for i in range(1, 12)]
            child_locked = await _locked(conn, ids["child"])
            open_at_freeze = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status <> 'COMPLETED'", siblings
            )
            # the siblings the healthy workers run (those the frozen one claimed wait for
            # their lease)
            healthy = await conn.fetchval(
                "SELECT array_agg(id) FROM jobs WHERE id = ANY($1) AND worker_id IS DISTINCT "
                "FROM NULL AND worker_id NOT LIKE $2 AND status <> 'COMPLETED'",
                siblings, f"%:{frozen_pid}:%",
            )  # fmt: skip
            healthy = list(healthy or [])

            def done(jobs: list[uuid.UUID]) -> str:
                listed = ",".join(map(str, jobs))
                return (f"SELECT count(*) = {len(jobs)} FROM jobs WHERE id = "
                        f"ANY('{{{listed}}}'::uuid[]) AND status = 'COMPLETED'")  # fmt: skip

            await timeline.watch({
                "healthy_siblings": done(healthy),
                "siblings": done(siblings),
                "p0": done([ids["p0"]]),
                "child_started": f"SELECT started_at IS NOT NULL FROM jobs WHERE id = '{ids['child']}'",  # noqa: E501
                "child_done": done([ids["child"]]),
            }, timeout=40)  # fmt: skip
            victim.signal(signal.SIGCONT)
            await victim.wait_for_log("pausing_statement: resumed", 10)
            p0 = await conn.fetchrow(
                "SELECT attempts, worker_id FROM jobs WHERE id = $1", ids["p0"]
            )
            accepted = list(await conn.fetchval("SELECT array_agg(id) FROM jobs"))
            verdict = await check(fsettings.database_url, accepted, ledger,
                                  label="fan-in, a worker frozen releasing", quiet=3.0)  # fmt: skip
            figures = await check_releases(fsettings.database_url, [wf_id], ledger)
        finally:
            await conn.close()
            for p in procs:
                p.signal(signal.SIGCONT)
            await asyncio.gather(*(p.stop() for p in procs))
    t = timeline.seen
    print(
        f"\n[faults] worker frozen releasing a fan-in child: {open_at_freeze} of 11 siblings "
        f"open at the freeze, {len(healthy)} of them on healthy workers; frozen session ended "
        f"at {timeline.ended} s; the healthy workers' siblings COMPLETED at "
        f"{t.get('healthy_siblings')} s, all siblings at {t.get('siblings')} s, p0 at "
        f"{t.get('p0')} s (attempt {p0['attempts']}), child started at "
        f"{t.get('child_started')} s, COMPLETED at {t.get('child_done')} s; at most "
        f"{timeline.lock_waiters} sessions waiting on a lock; {figures}"
    )
    verdict.assert_clean()
    assert healthy, "the healthy workers had no sibling left to complete: nothing raced it"
    assert child_locked, "the frozen transaction does not hold the child's row"
    assert timeline.ended is not None and timeline.ended < IDLE_BOUND + 3, timeline.ended
    # the siblings' completions waited on the child's row lock for the idle bound, no longer
    assert "healthy_siblings" in t and t["healthy_siblings"] < IDLE_BOUND + 4, t
    # the frozen worker's jobs: at their lease, then run again
    assert "child_done" in t and t["child_done"] < fsettings.visibility_timeout + 12, t
    assert p0["attempts"] >= 2 and p0["worker_id"] and f":{frozen_pid}:" not in p0["worker_id"]
    entries = ledger.entries()
    twice = {e.job_id for e in entries if e.what == "start" and e.attempt > 1}
    first_on_frozen = {e.job_id for e in entries if e.what == "start" and e.pid == frozen_pid}
    assert ids["p0"] in twice and twice <= first_on_frozen, (twice, first_on_frozen)
    # after SIGCONT the frozen worker started nothing again: its only runs are the first
    # attempts it had when it froze (their late outcomes fenced: the checker's double writes)
    late = [e for e in entries if e.pid == frozen_pid and e.what == "start" and e.attempt > 1]
    assert not late, late
    child_runs = [e for e in ledger.entries() if e.job_id == ids["child"] and e.what == "start"]
    assert len(child_runs) == 1, child_runs


@pytest.mark.timeout(120)
async def test_a_cancel_frozen_before_its_commit_wedges_no_worker(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """``conveyor workflows cancel`` frozen (SIGSTOP; an operator's Ctrl-Z does the same)
    between ``cancel_workflow`` and its COMMIT: it holds the workflow's row and every open job's
    row (``FOR UPDATE``, then updated): the most any workflow statement locks. The parents,
    running on two worker processes, finish meanwhile: their completions (and heartbeats) wait
    on those rows only until PostgreSQL ends the frozen session (idle in transaction, 5 s),
    which rolls the cancel back. Then every parent completes, the child is released once and
    runs once, the workflow COMPLETES; after SIGCONT the command fails with one line."""
    fsettings = fsettings.model_copy(update={"visibility_timeout": 9.0})
    flag = tmp_path / "freeze"
    flag.touch()
    wf = Workflow("cancel-frozen")
    gate = tmp_path / "go"  # the parents finish once the cancel froze
    payload = {"ledger": str(ledger), "sleep": 0, "gate": str(gate)}
    parents = [wf.add(f"p{i}", "work", payload) for i in range(12)]
    wf.add("child", "work", {"ledger": str(ledger), "sleep": 0}, after=parents)
    async with running(fsettings):
        fleet = WorkerFleet(fsettings, tmp_path, 2, concurrency=8)
        conn = await tdb.connect(fsettings.database_url, timeout=10)
        cli: Proc | None = None
        try:
            await fleet.ready()
            (wf_id,) = await _submit(fsettings.database_url, [wf])
            ids = dict(await conn.fetch(
                "SELECT workflow_key, id FROM jobs WHERE workflow_id = $1", wf_id))  # fmt: skip
            parent_ids = [ids[f"p{i}"] for i in range(12)]
            await wait_until(
                lambda: conn.fetchval("SELECT count(*) = 12 FROM jobs WHERE id = ANY($1) AND "
                                      "status = 'IN_PROGRESS'", parent_ids),
                timeout=20, interval=0.05, what="every parent running",
            )  # fmt: skip
            cli = _pausing(fsettings, tmp_path, "cancel", flag, "workflow_cancel",
                           "workflows", "cancel", str(wf_id))  # fmt: skip
            await _frozen([cli], timeout=30)
            timeline = Timeline(conn, None)
            gate.touch()
            timeline.frozen_pid = await _idle_backend(conn)
            running_at_freeze = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'IN_PROGRESS'",
                parent_ids,
            )
            parent_locked = await _locked(conn, parent_ids[0])
            listed = ",".join(map(str, parent_ids))
            await timeline.watch({
                "parents": f"SELECT count(*) = 12 FROM jobs WHERE id = ANY('{{{listed}}}'::uuid[])"
                           " AND status = 'COMPLETED'",
                "child_started": f"SELECT started_at IS NOT NULL FROM jobs WHERE id = '{ids['child']}'",  # noqa: E501
                "workflow": f"SELECT status <> 'RUNNING' FROM workflows WHERE id = '{wf_id}'",
            }, timeout=25)  # fmt: skip
            cli.signal(signal.SIGCONT)
            code = await cli.wait(30)
            accepted = list(await conn.fetchval("SELECT array_agg(id) FROM jobs"))
            verdict = await check(fsettings.database_url, accepted, ledger,
                                  label="workflow, a cancel frozen", quiet=2.0)  # fmt: skip
            status = await conn.fetchval("SELECT status FROM workflows WHERE id = $1", wf_id)
        finally:
            await conn.close()
            if cli is not None:
                cli.signal(signal.SIGCONT)
                await cli.stop()
            await fleet.stop()
    t = timeline.seen
    print(
        f"\n[faults] cancel frozen before its commit: {running_at_freeze} parents running at the "
        f"freeze; its session ended at {timeline.ended} s; every parent COMPLETED at "
        f"{t.get('parents')} s, the child started at {t.get('child_started')} s, the workflow "
        f"{status} at {t.get('workflow')} s; at most {timeline.lock_waiters} sessions waiting "
        f"on a lock; the command exited {code}: {cli.log()[-300:]!r}"
    )
    assert running_at_freeze == 12 and parent_locked
    assert timeline.lock_waiters >= 1, "no completion waited on the cancel's locks"
    assert timeline.ended is not None and timeline.ended < IDLE_BOUND + 3, timeline.ended
    assert "parents" in t and t["parents"] < IDLE_BOUND + 4, t
    assert "workflow" in t and t["workflow"] < IDLE_BOUND + 8, t
    verdict.assert_clean()
    assert status == "COMPLETED"
    assert ledger.count("start", ids["child"]) == 1
    # the cancel was rolled back and said so: one line, no traceback
    assert code not in (0, None) and "Traceback" not in cli.log(), cli.log()[-2000:]
    assert "idle-in-transaction timeout" in cli.log(), cli.log()[-2000:]
