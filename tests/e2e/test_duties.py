"""The relay and the maintenance duties run in every Conveyor process by default: real
``conveyor worker`` and ``conveyor api`` processes, with no ``conveyor publisher`` anywhere.

- the guide's embedding path (a worker, and ``enqueue()`` in the application's own transaction)
  runs the job;
- ``conveyor api`` alone relays what it accepted (workers scaled to zero still get their queues
  filled);
- with ``CONVEYOR_RUN_DUTIES=false`` nothing is relayed, and each process says, once, in its log
  and in its health details that the outbox holds old rows and no relay is connected."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest

from conveyor import enqueue
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings
from conveyor.publisher.relay import Relay

from .. import db as tdb
from ..stack import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CONVEYOR = [sys.executable, "-m", "conveyor.cli"]
UNRELAYED = "outbox_unrelayed"


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return {
        **env,
        "CONVEYOR_DATABASE_URL": settings.database_url,
        "CONVEYOR_AMQP_URL": settings.amqp_url,
        "CONVEYOR_NAMESPACE": settings.namespace,
        "CONVEYOR_AUTH": "disabled",
        "CONVEYOR_VISIBILITY_TIMEOUT": "5",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


class Proc:
    """A ``conveyor`` subprocess, its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [*CONVEYOR, *args], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_for_log(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.popen.poll() is None, f"exited {self.popen.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{self.log()}"
            await asyncio.sleep(0.1)

    async def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while self.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.popen.poll() is None:
            self.popen.kill()
        return self.popen.wait()


@contextlib.asynccontextmanager
async def _running(args: list[str], env: dict[str, str], log: Path) -> AsyncIterator[Proc]:
    proc = Proc(args, env, log)
    try:
        yield proc
    finally:
        await proc.stop()


async def _json(url: str) -> tuple[int, Any]:
    async with httpx.AsyncClient(timeout=5) as client:
        r = await client.get(url)
    return r.status_code, r.json()


async def _metrics(url: str) -> str:
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(url)).text


def _published(metrics: str) -> float:
    """``conveyor_outbox_published_total{destination="work"}`` in a /metrics page."""
    for line in metrics.splitlines():
        if line.startswith('conveyor_outbox_published_total{destination="work"}'):
            return float(line.split()[-1])
    return 0.0


async def _outbox_rows(db_url: str, job_id: uuid.UUID) -> int:
    conn = await tdb.connect(db_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM job_outbox WHERE job_id = $1", job_id))
    finally:
        await conn.close()


async def _ready_messages(settings: Settings, job_type: str) -> int:
    """Messages ready in the type's work queue (0 when nothing declared it)."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await conn.channel()
        name = Topology(settings.namespace).work_queue(job_type)
        try:
            queue = await channel.declare_queue(name, passive=True)
        except aio_pika.exceptions.ChannelClosed:
            return 0
        return int(queue.declaration_result.message_count or 0)
    finally:
        await conn.close()


@pytest.mark.timeout(150)
async def test_a_worker_alone_runs_a_job_enqueued_in_the_apps_transaction(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """docs/guide.md's embedding path: `conveyor migrate` (the test's database is migrated),
    the types registered, `conveyor worker`, and `enqueue()` in the application's transaction
    on a plain asyncpg connection. No `conveyor publisher` runs."""
    health = free_port()
    args = ["worker", "--app", "tests.apps:router", "--concurrency", "2"]
    args += ["--health-port", str(health)]
    async with _running(args, _env(settings), tmp_path / "worker.log") as worker:
        await worker.wait_for_log("worker_started")
        conn = await asyncpg.connect(db_url)  # the application's own: no search_path of ours
        try:
            async with conn.transaction():
                job_id = await enqueue(conn, "echo", {"order": 42})
        finally:
            await conn.close()
        statuses = await wait_for(db_url, [job_id], statuses=["COMPLETED"], timeout=60)
        assert statuses == {job_id: "COMPLETED"}, worker.log()
        # the relay's and the worker's metrics on one registry: the worker's health port
        assert _published(await _metrics(f"http://127.0.0.1:{health}/metrics")) >= 1
        _, details = await _json(f"http://127.0.0.1:{health}/healthz")
        assert details["duties"]["state"] == "holder" and details["duties"]["running"], details


@pytest.mark.timeout(150)
async def test_the_api_alone_relays_what_it_accepted(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """`conveyor api` and nothing else (no worker, no publisher): a job submitted over HTTP is
    relayed to its queue, where a worker scaled to zero (KEDA) would find it."""
    port = free_port()
    args = ["api", "--port", str(port)]
    async with _running(args, _env(settings), tmp_path / "api.log") as api:
        await api.wait_for_log("api_started")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            r = await client.post("/jobs", json={"type": "echo", "payload": {"n": 1}})
        assert r.status_code == 201, r.text
        job_id = uuid.UUID(r.json()["id"])
        deadline = time.monotonic() + 60
        while await _outbox_rows(db_url, job_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await _outbox_rows(db_url, job_id) == 0, api.log()
        assert await _ready_messages(settings, "echo") == 1
        assert _published(await _metrics(f"http://127.0.0.1:{port}/metrics")) == 1
        _, details = await _json(f"http://127.0.0.1:{port}/healthz")
        assert details["status"] == "ok" and details["duties"]["state"] == "holder", details
        statuses = await wait_for(db_url, [job_id], statuses=["PENDING"], timeout=1)
        assert statuses == {job_id: "PENDING"}  # published, waiting for a worker


async def _watch_says(url: str, timeout: float = 60) -> dict[str, Any]:
    """The ``outbox`` part of a process's health details, once it reports unrelayed rows."""
    deadline = time.monotonic() + timeout
    while True:
        code, body = await _json(url)
        outbox = body.get("duties", {}).get("outbox", {})
        if outbox.get("unrelayed"):
            return {"code": code, **outbox}
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.2)


@pytest.mark.timeout(180)
async def test_with_the_duties_off_old_rows_and_no_relay_are_reported_once(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """CONVEYOR_RUN_DUTIES=false in a worker and an API: nothing relays. Once the oldest outbox
    row is older than CONVEYOR_OUTBOX_STALE_AFTER (2 s here instead of 30) and no relay is
    connected, each process says so in its health details and, once for the episode, in its log;
    a relay started later ends the episode (said once too)."""
    env = _env(settings, CONVEYOR_RUN_DUTIES="false", CONVEYOR_OUTBOX_STALE_AFTER="2")
    health, port = free_port(), free_port()
    worker_args = ["worker", "--app", "tests.apps:router", "--health-port", str(health)]
    async with (
        _running(worker_args, env, tmp_path / "worker.log") as worker,
        _running(["api", "--port", str(port)], env, tmp_path / "api.log") as api,
    ):
        await worker.wait_for_log("worker_started")
        await api.wait_for_log("api_started")
        conn = await asyncpg.connect(db_url)
        try:
            async with conn.transaction():
                job_id = await enqueue(conn, "echo", {"n": 1})
        finally:
            await conn.close()
        for url in (f"http://127.0.0.1:{health}/healthz", f"http://127.0.0.1:{port}/healthz"):
            outbox = await _watch_says(url)
            assert outbox["code"] == 200  # a report, not a reason to restart the process
            assert outbox["relays_connected"] == 0 and outbox["oldest_seconds"] >= 2, outbox
        await worker.wait_for_log(UNRELAYED)
        await api.wait_for_log(UNRELAYED)
        await asyncio.sleep(4)  # several more passes of the watch: still one line each
        for proc in (worker, api):
            lines = [line for line in proc.log().splitlines() if UNRELAYED in line]
            assert len(lines) == 1, proc.log()
            assert "no relay" in lines[0] and "CONVEYOR_RUN_DUTIES" in lines[0], lines
        assert await _outbox_rows(db_url, job_id) == 1  # nothing relayed it
        assert await _ready_messages(settings, "echo") == 0
        assert (await wait_for(db_url, [job_id], statuses=["PENDING"], timeout=1)) == {
            job_id: "PENDING"
        }

        relay = Relay(settings)  # a relay comes: the episode ends, said once, and the job runs
        await relay.start()
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        try:
            await wait_for(db_url, [job_id], statuses=["COMPLETED"], timeout=60)
            await worker.wait_for_log("outbox_relayed_again")
            deadline = time.monotonic() + 30
            while (await _json(f"http://127.0.0.1:{health}/healthz"))[1]["duties"]["outbox"][
                "unrelayed"
            ]:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            await task
            await relay.close()
        assert sum("outbox_relayed_again" in line for line in worker.log().splitlines()) == 1


async def _state(url: str) -> str:
    with contextlib.suppress(httpx.HTTPError):
        return str((await _json(url))[1]["duties"]["state"])
    return "unreachable"


async def _until_state(url: str, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (now := await _state(url)) != state:
        assert time.monotonic() < deadline, f"{url}: {now}, not {state}"
        await asyncio.sleep(0.2)


@pytest.mark.timeout(180)
async def test_a_frozen_holder_loses_the_duties_to_another_process(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """`conveyor api` holds the duties, a worker stands by. The API is frozen (SIGSTOP: its
    host still answers TCP keepalives, its connections stay open): its election session is
    ended by idle_session_timeout (3 turns; a turn is 1 s with CONVEYOR_OUTBOX_STALE_AFTER=3),
    the worker takes the duties and runs a job enqueued meanwhile. Thawed, the API finds it
    lost them and stands by."""
    env = _env(settings, CONVEYOR_OUTBOX_STALE_AFTER="3")
    health, port = free_port(), free_port()
    api_health = f"http://127.0.0.1:{port}/healthz"
    worker_health = f"http://127.0.0.1:{health}/healthz"
    worker_args = ["worker", "--app", "tests.apps:router", "--health-port", str(health)]
    async with _running(["api", "--port", str(port)], env, tmp_path / "api.log") as api:
        await _until_state(api_health, "holder")
        async with _running(worker_args, env, tmp_path / "worker.log") as worker:
            await worker.wait_for_log("worker_started")
            await _until_state(worker_health, "standby")
            api.popen.send_signal(signal.SIGSTOP)
            try:
                conn = await asyncpg.connect(db_url)
                try:
                    job_id = await enqueue(conn, "echo", {"frozen": True})
                finally:
                    await conn.close()
                await wait_for(db_url, [job_id], statuses=["COMPLETED"], timeout=60)
                assert await _state(worker_health) == "holder"
            finally:
                api.popen.send_signal(signal.SIGCONT)
            await _until_state(api_health, "standby")
            assert "duties_lost" in api.log()
            assert await _state(worker_health) == "holder"


async def _sessions(db_url: str, name: str) -> int:
    conn = await tdb.connect(db_url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = $1",
                name,
            )
        )
    finally:
        await conn.close()


@pytest.mark.timeout(150)
async def test_api_workers_elect_one_relay(settings: Settings, db_url: str, tmp_path: Path) -> None:
    """`conveyor api --workers 2`: each process takes part in the election (one session each),
    one of them relays."""
    port = free_port()
    args = ["api", "--port", str(port), "--workers", "2"]
    async with _running(args, _env(settings), tmp_path / "api.log") as api:
        deadline = time.monotonic() + 60
        while await _sessions(db_url, "conveyor-duties") < 2:
            assert time.monotonic() < deadline, api.log()
            await asyncio.sleep(0.2)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            r = await client.post("/jobs", json={"type": "echo", "payload": {}})
        assert r.status_code == 201, r.text
        job_id = uuid.UUID(r.json()["id"])
        while await _outbox_rows(db_url, job_id):
            assert time.monotonic() < deadline, api.log()
            await asyncio.sleep(0.2)
        await asyncio.sleep(1)
        assert await _sessions(db_url, "conveyor-publisher-listen") == 1
        assert await _sessions(db_url, "conveyor-duties") == 2
