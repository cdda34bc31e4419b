"""A worker's liveness says when it is wedged, so Kubernetes restarts it: a blocked event loop,
a stuck outcome writer, abandoned handler threads. And handlers that raise BaseExceptions do not
kill the worker process."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import httpx

from conveyor.core.config import Settings
from conveyor.worker import Worker
from conveyor.worker.health import serve_health

from .. import db as tdb
from ..faults.harness import component_env
from ..stack import free_port, running_stack, wait_for
from . import worker_apps
from .worker_apps import router

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.worker_apps:router"


async def _worker_process(
    settings: Settings, log: Path, *args: str, **env: str
) -> asyncio.subprocess.Process:
    conveyor = str(Path(sys.executable).parent / "conveyor")
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            conveyor, "worker", "--app", APP, *args,
            env=component_env(settings, **env), cwd=ROOT, stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip


async def _healthz(port: int) -> tuple[int, dict[str, object]] | None:
    try:
        async with httpx.AsyncClient(timeout=0.5) as c:
            r = await c.get(f"http://127.0.0.1:{port}/healthz")
            return r.status_code, r.json()
    except httpx.HTTPError:
        return None


# SystemExit, KeyboardInterrupt and GeneratorExit from a handler are failures of the job: they
# neither kill the worker process (exit code 3 on the first job) nor, for GeneratorExit, the
# job's task without an outcome.


async def test_base_exceptions_from_handlers_are_failures_not_exits(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    async with running_stack(settings, None) as stack:
        proc = await _worker_process(settings, tmp_path / "w.log", "--concurrency", "4")
        try:
            bad = [await stack.submit(t) for t in
                   ("exits", "interrupts", "generator_exit", "sync_exits")]  # fmt: skip
            statuses = await wait_for(db_url, bad, timeout=30)
            assert set(statuses.values()) == {"FAILED"}, statuses
            later = await stack.submit("echo")
            await wait_for(db_url, [later], statuses=["COMPLETED"], timeout=20)
            assert proc.returncode is None, (tmp_path / "w.log").read_text()[-3000:]
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0, (tmp_path / "w.log").read_text()[-3000:]
    conn = await tdb.connect(db_url)
    try:
        errors = await conn.fetch(
            "SELECT job_type, last_error FROM jobs WHERE id = ANY($1::uuid[])",
            [uuid.UUID(i) for i in bad],
        )
    finally:
        await conn.close()
    names = {"exits": "SystemExit", "interrupts": "KeyboardInterrupt",
             "generator_exit": "GeneratorExit", "sync_exits": "SystemExit"}  # fmt: skip
    for e in errors:
        assert names[e["job_type"]] in e["last_error"], dict(e)


# An async handler that blocks the event loop stops heartbeats for every job on the worker, and
# /healthz says so with a 503 (served on that same loop, it would give no answer at all while
# blocked and 200 afterwards).


async def test_a_blocked_event_loop_fails_liveness_until_it_turns_again(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    port = free_port()
    async with running_stack(settings, None) as stack:
        proc = await _worker_process(
            settings, tmp_path / "w.log", "--concurrency", "2", "--health-port", str(port),
            CONVEYOR_WORKER_LOOP_STALL_LIMIT="1", CONVEYOR_WORKER_LOOP_BLOCK_LIMIT="0",
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while (await _healthz(port)) is None:
                assert time.monotonic() < deadline, "the worker's probe never answered"
                await asyncio.sleep(0.1)
            job = await stack.submit("blocks_loop", {"seconds": 4})
            seen: list[tuple[int, dict[str, object]] | None] = []
            deadline = time.monotonic() + 20
            while True:
                answer = await _healthz(port)
                seen.append(answer)
                if answer is not None and answer[0] == 503:
                    break
                assert time.monotonic() < deadline, f"liveness never failed: {seen[-5:]}"
                await asyncio.sleep(0.1)
            assert answer[1]["loop_blocked_seconds"] >= 1, answer  # type: ignore[operator]
            await wait_for(db_url, [job], statuses=["COMPLETED"], timeout=20)
            deadline = time.monotonic() + 10
            while (answer := await _healthz(port)) is None or answer[0] != 200:
                assert time.monotonic() < deadline, f"liveness did not recover: {answer}"
                await asyncio.sleep(0.1)
            async with httpx.AsyncClient() as c:
                metrics = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
            assert "conveyor_worker_loop_lag_max_seconds" in metrics
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0, (tmp_path / "w.log").read_text()[-3000:]


# Liveness reflects a stuck outcome writer: while outcomes cannot be written (here: the job's
# row locked by someone else), /healthz answers 503, and 200 again once they are written.


async def test_a_stuck_outcome_writer_fails_liveness(settings: Settings, db_url: str) -> None:
    s = settings.model_copy(update={"worker_outcome_deadline": 0.5})
    async with running_stack(s, None) as stack:
        worker = Worker(s, router, concurrency=2)
        await worker.start()
        port = free_port()
        server = await serve_health(worker, "127.0.0.1", port)
        locker = await tdb.connect(db_url)
        try:
            job = await stack.submit("slow", {"seconds": 0.5})
            await wait_for(db_url, [job], statuses=["IN_PROGRESS"], timeout=20)
            tx = locker.transaction()
            await tx.start()
            await locker.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", uuid.UUID(job))
            deadline = time.monotonic() + 20
            while (answer := await _healthz(port)) is None or answer[0] != 503:
                assert time.monotonic() < deadline, f"liveness stayed green: {answer}"
                await asyncio.sleep(0.1)
            assert answer[1]["outcomes_waiting"] == 1, answer
            await tx.commit()
            await wait_for(db_url, [job], statuses=["COMPLETED"], timeout=20)
            deadline = time.monotonic() + 10
            while (answer := await _healthz(port)) is None or answer[0] != 200:
                assert time.monotonic() < deadline, f"liveness did not recover: {answer}"
                await asyncio.sleep(0.1)
        finally:
            await locker.close()
            server.close()
            await worker.stop(grace=1)


async def test_every_slot_held_by_overrunning_work_fails_liveness(
    settings: Settings, db_url: str
) -> None:
    """Work past its timeout keeps its slot until it ends; past ``worker_overrun_limit`` more
    it is given up on: its job stays IN_PROGRESS (no retry runs beside the thread), noted in its
    last_error, and liveness fails (only a restart stops such work); both slots so held is also
    a worker whose capacity is gone. Once the threads end, the timeouts are written (FAILED) and
    the worker is healthy again."""
    s = settings.model_copy(update={"worker_overrun_limit": 1.0})
    worker_apps.RELEASE_THREADS.clear()
    async with running_stack(s, None) as stack:
        worker = Worker(s, router, concurrency=2)
        await worker.start()
        port = free_port()
        server = await serve_health(worker, "127.0.0.1", port)
        try:
            first = await stack.submit("stuck_sync")
            await wait_for(db_url, [first], ["IN_PROGRESS"], timeout=20)
            # given up on past its 0.5 s timeout + the 1 s overrun limit, its thread running
            deadline = time.monotonic() + 10
            while worker.status().executor.given_up < 1:
                assert time.monotonic() < deadline, worker.status().executor
                await asyncio.sleep(0.05)
            assert worker.status().executor.threads_abandoned == 1
            await worker.heartbeater.beat_once()  # writes the note
            row = await _row(db_url, first)
            assert row["status"] == "IN_PROGRESS", dict(row)
            assert "IN_PROGRESS until that work stops" in row["last_error"], dict(row)
            deadline = time.monotonic() + 10  # the probe reads a snapshot taken every 0.25 s
            while (answer := await _healthz(port)) is None or answer[0] != 503:
                assert time.monotonic() < deadline, f"liveness stayed green: {answer}"
                await asyncio.sleep(0.05)
            assert answer[1]["given_up"] == 1, answer
            assert "cannot be stopped" in answer[1]["reasons"][0], answer
            second = await stack.submit("stuck_sync")
            await wait_for(db_url, [second], ["IN_PROGRESS"], timeout=20)
            deadline = time.monotonic() + 10
            while (answer := await _healthz(port)) is None or answer[1]["given_up"] < 2:
                assert time.monotonic() < deadline, f"not both given up on: {answer}"
                await asyncio.sleep(0.05)
            assert answer[0] == 503, answer
            assert any("every slot (2) held" in r for r in answer[1]["reasons"]), answer
            worker_apps.RELEASE_THREADS.set()
            deadline = time.monotonic() + 10
            while (answer := await _healthz(port)) is None or answer[0] != 200:
                assert time.monotonic() < deadline, f"liveness did not recover: {answer}"
                await asyncio.sleep(0.05)
            ended = await wait_for(db_url, [first, second], timeout=20)
            assert set(ended.values()) == {"FAILED"}, ended
            for job in (first, second):
                assert "TimeoutError" in (await _row(db_url, job))["last_error"]
        finally:
            worker_apps.RELEASE_THREADS.set()
            server.close()
            await worker.stop(grace=1)


async def _row(db_url: str, job: str) -> asyncpg.Record:
    conn = await tdb.connect(db_url)
    try:
        return await conn.fetchrow(
            "SELECT status::text AS status, last_error FROM jobs WHERE id = $1", uuid.UUID(job)
        )
    finally:
        await conn.close()


async def test_jobs_of_a_worker_whose_loop_is_blocked_are_recovered_elsewhere_once(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """Worker A runs a 6 s job when another handler blocks A's loop for 14 s: A's heartbeats
    stop, the job's lease (5 s) expires, the sweeper hands it to worker B, which completes it;
    when A's loop turns again its own completion is fenced. COMPLETED once, by B."""
    log = tmp_path / "a.log"
    async with running_stack(settings, None) as stack:
        proc = await _worker_process(  # a block the guard does not end (C code, limit 0)
            settings, log, "--concurrency", "2", CONVEYOR_WORKER_LOOP_BLOCK_LIMIT="0"
        )
        try:
            job = await stack.submit("slow", {"seconds": 6})
            await wait_for(db_url, [job], statuses=["IN_PROGRESS"], timeout=20)
            blocker = await stack.submit("blocks_loop", {"seconds": 14})
            await wait_for(db_url, [blocker], statuses=["IN_PROGRESS"], timeout=20)
            b = await stack.add_worker(router, types=["slow"], concurrency=2)
            await wait_for(db_url, [job], statuses=["COMPLETED"], timeout=40)
            await wait_for(db_url, [blocker], timeout=40)
            deadline = time.monotonic() + 20
            while b"job_write_fenced" not in log.read_bytes():
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                await asyncio.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
    conn = await tdb.connect(db_url)
    try:
        row = await conn.fetchrow(
            "SELECT status::text AS status, attempts, worker_id FROM jobs WHERE id = $1",
            uuid.UUID(job),
        )
    finally:
        await conn.close()
    assert (row["status"], row["attempts"], row["worker_id"]) == ("COMPLETED", 2, b.worker_id)
    assert code == 0, log.read_text()[-3000:]
