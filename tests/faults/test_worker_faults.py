"""Workers that die: SIGKILL mid-job (guarantees 2-4), SIGTERM drains (7), handlers that always
fail or kill their own process (5). Workers are real ``conveyor worker`` processes; the API,
relay and sweeper run in the test's loop."""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from pathlib import Path

import asyncpg
import orjson
import pytest

from conveyor.core.config import Settings

from .. import db as tdb
from .apps import router
from .checker import Ledger, check, status_counts
from .harness import (
    WorkerFleet,
    drain,
    queue_ready,
    running,
    topology,
    wait_until,
    worker_proc,
)


async def _rows(db_url: str, ids: list[str]) -> dict[str, asyncpg.Record]:
    conn = await tdb.connect(db_url, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT id, status::text AS status, attempts, retry_count, last_error FROM jobs"
            " WHERE id = ANY($1::uuid[])",
            [uuid.UUID(i) for i in ids],
        )
    finally:
        await conn.close()
    return {str(r["id"]): r for r in rows}


@pytest.mark.timeout(240)
async def test_sigkill_workers_repeatedly(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """Three worker processes, one SIGKILLed (and replaced) about every second while 300 jobs
    are submitted and run: every job completes, exactly once in PostgreSQL."""
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    rng = random.Random(seed)
    n_jobs, max_kills = 300, 14
    async with running(fsettings) as stack:
        fleet = WorkerFleet(fsettings, tmp_path, 3, concurrency=4)
        await fleet.ready()
        stop = asyncio.Event()

        async def killer() -> None:
            while not stop.is_set() and fleet.kills < max_kills:
                await asyncio.sleep(rng.uniform(0.5, 1.3))
                await fleet.kill_one(rng)

        supervisor = asyncio.create_task(fleet.supervise(stop))
        kills = asyncio.create_task(killer())
        await stack.submit_many(
            n_jobs, "work",
            lambda i: {"ledger": str(ledger), "sleep": round(rng.uniform(0.1, 0.5), 3)},
            parallel=20, pace=0.15,
        )  # fmt: skip

        async def mostly_done() -> bool:
            c = await status_counts(fsettings.database_url)
            return c["COMPLETED"] >= 0.9 * n_jobs or kills.done()

        await wait_until(mostly_done, timeout=120, interval=0.3, what="90% completed")
        stop.set()
        await kills
        await supervisor
        v = await check(fsettings.database_url, stack.accepted, ledger, label="sigkill-workers",
                        timeout=90)  # fmt: skip
        v.extra.update(kills=fleet.kills, seed=seed, unexpected_deaths=fleet.deaths)
        print(f"[faults] sigkill: {fleet.kills} SIGKILLs, seed {seed}")
        codes = await fleet.stop()
    v.assert_clean()
    assert fleet.kills >= 5, "the run ended before enough workers were killed"
    assert fleet.deaths == 0, f"workers died without being killed: {fleet.exit_codes}"
    assert codes == [0, 0, 0], codes


@pytest.mark.serial  # a bound in seconds on a process's drain
@pytest.mark.timeout(120)
async def test_sigterm_drains_within_grace(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """SIGTERM while 3 short and 3 over-long jobs run and 6 more wait (in the queue or the
    worker's prefetch buffer): the worker exits 0 within the grace (2 s, plus 1.5 s of slack for
    closing connections); the short jobs complete, the long ones are handed back as PENDING
    without consuming a retry, the waiting ones stay unclaimed. A new worker finishes them all."""
    grace = fsettings.shutdown_grace
    db = fsettings.database_url
    async with running(fsettings) as stack:
        w = worker_proc(fsettings, tmp_path, "worker-term", concurrency=6).start()
        await w.wait_for_log("worker_started")
        long_ids = [
            await stack.submit("work", {"ledger": str(ledger), "sleep_first": 60, "sleep": 0.1})
            for _ in range(3)
        ]
        short_ids = [await stack.submit("work", {"ledger": str(ledger), "sleep": 1.2})
                     for _ in range(3)]  # fmt: skip

        async def six_running() -> bool:
            return (await status_counts(db))["IN_PROGRESS"] == 6

        await wait_until(six_running, timeout=15, what="6 jobs in progress")
        queued_ids = [await stack.submit("work", {"ledger": str(ledger), "sleep": 0.1})
                      for _ in range(6)]  # fmt: skip
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        w.signal(15)
        code = await w.wait(grace + 10)
        elapsed = time.monotonic() - t0
        rows = await _rows(db, long_ids + short_ids + queued_ids)
        print(f"[faults] sigterm: exit code {code} after {elapsed:.2f}s (grace {grace}s); "
              f"long={[rows[i]['status'] for i in long_ids]} "
              f"short={[rows[i]['status'] for i in short_ids]} "
              f"queued={[rows[i]['status'] for i in queued_ids]}")  # fmt: skip
        assert code == 0, w.log()[-3000:]
        assert elapsed < grace + 1.5, f"drain took {elapsed:.2f}s with a {grace}s grace"
        for i in short_ids:
            assert rows[i]["status"] == "COMPLETED", rows[i]
        for i in long_ids:
            assert rows[i]["status"] == "PENDING", rows[i]
            assert rows[i]["retry_count"] == 0 and rows[i]["attempts"] == 1, rows[i]
        for i in queued_ids:
            assert rows[i]["status"] == "PENDING" and rows[i]["attempts"] == 0, rows[i]

        w2 = worker_proc(fsettings, tmp_path, "worker-after", concurrency=6).start()
        v = await check(db, stack.accepted, ledger, label="sigterm-drain", timeout=30)
        v.extra.update(exit_code=code, drain_seconds=round(elapsed, 2))
        assert await w2.stop() == 0
    v.assert_clean()
    rows = await _rows(db, long_ids)
    assert all(r["attempts"] == 2 for r in rows.values()), rows


# The failure this guards against: on SIGTERM the worker cancels the asyncio side of a
# sync handler and releases the job, but the handler keeps running in a ThreadPoolExecutor thread,
# and the interpreter joins that thread at exit: the process outlives the grace by the handler's
# whole run time (Kubernetes then SIGKILLs it: exit 137, not 0), while the released job may
# already run elsewhere


@pytest.mark.serial  # a bound in seconds on a process's exit
@pytest.mark.timeout(60)
async def test_sigterm_with_a_sync_handler_running_exits_within_grace(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """A synchronous handler runs 15 s; SIGTERM with a 2 s grace: the worker must exit 0 within
    the grace (the job handed back), not when the thread is done."""
    grace = fsettings.shutdown_grace
    async with running(fsettings) as stack:
        w = worker_proc(fsettings, tmp_path, "worker-sync", concurrency=2).start()
        await w.wait_for_log("worker_started")
        job_id = await stack.submit("sync_work", {"ledger": str(ledger), "sleep_first": 15})

        async def started() -> bool:
            return ledger.count("start") == 1

        await wait_until(started, timeout=15, what="the sync handler to start")
        t0 = time.monotonic()
        w.signal(15)
        code = await w.wait(grace + 4)
        elapsed = time.monotonic() - t0
        if code is None:
            await w.kill()
        row = (await _rows(fsettings.database_url, [job_id]))[job_id]
        print(f"[faults] sigterm with a sync handler: exit {code} after {elapsed:.1f}s "
              f"(grace {grace}s); job {row['status']}")  # fmt: skip
        w2 = worker_proc(fsettings, tmp_path, "worker-sync-after", concurrency=2).start()
        v = await check(fsettings.database_url, stack.accepted, ledger, label="sigterm-sync",
                        timeout=30)  # fmt: skip
        await w2.stop()
    v.assert_clean()
    assert code == 0 and elapsed < grace + 1.5, f"exit {code} after {elapsed:.1f}s"


async def test_always_failing_handler_ends_failed_and_dead_lettered(
    fsettings: Settings, ledger: Ledger
) -> None:
    """``doomed`` raises every time (max_retries=2, retry_delays=[1]): 3 attempts, then FAILED
    with its last error (``retry_count`` 2: retries performed, never above ``max_retries``), and
    one copy in the dead-letter queue carrying that error."""
    async with running(fsettings, routers=[router], concurrency=8) as stack:
        ids = await stack.submit_many(5, "doomed", lambda i: {"ledger": str(ledger)})
        v = await check(fsettings.database_url, stack.accepted, ledger, label="always-fails",
                        timeout=30)  # fmt: skip
    rows = await _rows(fsettings.database_url, ids)
    dead = await drain(fsettings.amqp_url, topology(fsettings).dead_letter_queue)
    v.extra["dead_lettered"] = len(dead)
    v.assert_clean(expect="FAILED")
    for r in rows.values():
        assert r["attempts"] == 3 and r["retry_count"] == 2, dict(r)
        assert "doomed: attempt 3 failed on purpose" in r["last_error"], r["last_error"]
    assert v.executed == 15
    letters = {orjson.loads(m.body)["id"]: orjson.loads(m.body) for m in dead}
    assert sorted(letters) == sorted(ids), [m.body[:200] for m in dead]
    assert all("doomed: attempt 3" in (d.get("error") or "") for d in letters.values())


# A worker's start, generously: seconds on a loaded machine, more under a parallel run that also
# loads PostgreSQL.
RESTART_BUDGET = 30.0


async def _settle_step_by_step(
    settings: Settings, fleet: WorkerFleet, ids: list[str], *, restart: float = RESTART_BUDGET
) -> float:
    """Wait until every job is terminal, allowing each step of progress (a worker death, a job's
    status or attempts changing) one attempt's bound: a worker restart, the lease, a lease sweep,
    the longest pen a first retry takes (2 s) and the reconciler's delay (``reconcile_after`` +
    two intervals: a lost retry would be re-published by then). A job with no way forward stops
    the progress and fails here, with what is left."""
    s = settings
    step = (restart + s.visibility_timeout + s.lease_sweep_interval + 2.0 + s.reconcile_after
            + 2 * s.reconcile_interval)  # fmt: skip
    t0 = last_change = time.monotonic()
    seen: object = None
    while True:
        rows = await _rows(s.database_url, ids)
        state = (fleet.deaths, sorted((r["status"], r["attempts"]) for r in rows.values()))
        if state != seen:
            seen, last_change = state, time.monotonic()
        if all(r["status"] in ("FAILED", "COMPLETED", "CANCELLED") for r in rows.values()):
            return time.monotonic() - t0
        if time.monotonic() - last_change > step:
            work_q = topology(s).work_queue("suicide")
            worker = fleet.slots[0]
            raise AssertionError(
                f"no progress for {step:.1f} s after {time.monotonic() - t0:.1f} s: "
                f"{[dict(r) for r in rows.values()]}; deaths {fleet.deaths}; "
                f"{await queue_ready(s.amqp_url, work_q)} ready in {work_q}; "
                f"{worker.name} alive={worker.alive()} started={'worker_started' in worker.log()}"
            )
        await asyncio.sleep(0.3)


# Six attempts on one worker of concurrency 1, each killing it: the critical path is five worker
# restarts in a row. A fixed settle time (60 s) can run out under a parallel run with 5 deaths
# and the last job RETRYING, attempts=1: its messages waiting for the last restart
# (tests/faults/test_retry_after_worker_death.py steps that state and a lost retry's rescue).
@pytest.mark.serial  # six worker restarts in a row
@pytest.mark.timeout(300)
async def test_handler_that_kills_its_worker_ends_failed(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """``suicide`` calls ``os._exit(1)`` (max_retries=1). The supervisor restarts the worker
    each time; each job is attempted max_retries + 1 = 2 times, then FAILED by the lease sweep
    and dead-lettered — not retried forever. Each attempt must follow the last within its bound
    (``_settle_step_by_step``), however slowly workers start on a loaded machine."""
    async with running(fsettings) as stack:
        fleet = WorkerFleet(fsettings, tmp_path, 1, concurrency=1)
        await fleet.ready()
        stop = asyncio.Event()
        supervisor = asyncio.create_task(fleet.supervise(stop))
        ids = await stack.submit_many(3, "suicide", lambda i: {"ledger": str(ledger)})
        try:
            took = await _settle_step_by_step(fsettings, fleet, ids)
        finally:
            stop.set()
            await supervisor
        v = await check(fsettings.database_url, stack.accepted, ledger, label="os-exit-handler",
                        timeout=10, quiet=3.0)  # fmt: skip
        v.extra["settled_step_by_step_in"] = round(took, 1)
        v.extra.update(worker_deaths=fleet.deaths)
        await fleet.stop()
    rows = await _rows(fsettings.database_url, ids)
    dead = await drain(fsettings.amqp_url, topology(fsettings).dead_letter_queue)
    v.assert_clean(expect="FAILED")
    for r in rows.values():
        assert r["attempts"] == 2, dict(r)
        assert "lease expired" in r["last_error"], r["last_error"]
    assert v.executed == 6, f"{v.executed} attempts started, expected 2 per job"
    assert fleet.deaths == 6 and set(fleet.exit_codes) == {1}, fleet.exit_codes
    assert sorted(orjson.loads(m.body)["id"] for m in dead) == sorted(ids)
