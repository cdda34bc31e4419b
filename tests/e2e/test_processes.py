"""The real processes: `conveyor dev` as a new user runs it, the worker's SIGTERM drain, the
operator commands (`conveyor jobs`, `conveyor dlq`)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import orjson
import pytest

from conveyor.core.config import Settings

from .. import apps
from .. import db as tdb
from ..stack import free_port, running_stack, wait_for

ROOT = Path(__file__).resolve().parents[2]
CONVEYOR = [sys.executable, "-m", "conveyor.cli"]


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "CONVEYOR_DATABASE_URL": settings.database_url,
        "CONVEYOR_AMQP_URL": settings.amqp_url,
        "CONVEYOR_NAMESPACE": settings.namespace,
        "CONVEYOR_VISIBILITY_TIMEOUT": "5",
        **extra,
    }


async def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CONVEYOR, *args, env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.parametrize(
    "args",
    [[], ["migrate"], ["api"], ["publisher"], ["sweeper"], ["worker"], ["dev"], ["jobs"],
     ["jobs", "list"], ["dlq"], ["dlq", "redrive"]],
)  # fmt: skip
def test_every_command_documents_itself(args: list[str]) -> None:
    out = subprocess.run([*CONVEYOR, *args, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "usage: conveyor" in out.stdout


@pytest.mark.timeout(90)
async def test_dev_prints_a_curl_line_that_works(settings: Settings) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *CONVEYOR, "dev", "--app", "examples.app:router", "--port", str(port),
        env=_env(settings), cwd=ROOT, stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        curl = None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while curl is None and time.monotonic() < deadline:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, "dev exited early:\n" + "".join(lines)
            lines.append(line)
            if line.strip().startswith("curl -s -X POST"):
                curl = line.strip()
        assert curl is not None
        assert any("auth disabled (loopback only)" in line for line in lines), lines
        out = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=20)
        job = orjson.loads(out.stdout)
        assert job["status"] in ("PENDING", "IN_PROGRESS", "COMPLETED")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(200):
                body = (await client.get(f"/jobs/{job['id']}")).json()
                if body["status"] == "COMPLETED":
                    break
                await asyncio.sleep(0.05)
        assert body["status"] == "COMPLETED" and body["result"] == {"greeting": "Hello, world!"}
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0


async def test_dev_says_in_one_line_when_a_service_is_down(settings: Settings) -> None:
    env = _env(settings, CONVEYOR_DATABASE_URL="postgresql://postgres@127.0.0.1:1/conveyor")
    code, _, err = await _run(["dev", "--app", "examples.app:router"], env)
    assert code == 2
    assert "Cannot reach PostgreSQL" in err and "pg_ctlcluster" in err and "docker compose" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    env = _env(settings, CONVEYOR_AMQP_URL="amqp://guest:guest@127.0.0.1:1/")
    code, _, err = await _run(["dev", "--app", "examples.app:router"], env)
    assert code == 2 and "Cannot reach RabbitMQ" in err and "Traceback" not in err


async def test_dev_on_a_router_without_handlers_is_one_line(
    settings: Settings, tmp_path: Path
) -> None:
    """A newcomer's first app, before its first handler: ``conveyor dev --app app:router`` says
    so in one line and exits 2, as ``conveyor worker`` does (it printed a ValueError traceback)."""
    (tmp_path / "firstapp.py").write_text("from conveyor import JobRouter\nrouter = JobRouter()\n")
    proc = await asyncio.create_subprocess_exec(
        *CONVEYOR, "dev", "--app", "firstapp:router", "--port", str(free_port()),
        env=_env(settings), cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, (proc.returncode, err.decode())
    assert err.decode().splitlines() == ["conveyor dev: the router has no handlers"], err.decode()
    assert out == b""


async def _worker(settings: Settings, *extra: str, grace: str = "10") -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *CONVEYOR, "worker", "--app", "tests.apps:router", "--concurrency", "4",
        "--shutdown-grace", grace, *extra,
        env=_env(settings), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.timeout(90)
async def test_sigterm_lets_in_flight_jobs_finish_and_exits_zero(
    settings: Settings, db_url: str
) -> None:
    async with running_stack(settings, None) as stack:
        worker = await _worker(settings)
        job_id = await stack.submit("slow", {"seconds": 2})
        await wait_for(db_url, [job_id], statuses=["IN_PROGRESS"], timeout=20)
        t0 = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(worker.wait(), 20)
        assert code == 0
        assert time.monotonic() - t0 < 10
        statuses = await wait_for(db_url, [job_id], timeout=1)
        assert statuses[uuid.UUID(job_id)] == "COMPLETED"


@pytest.mark.timeout(90)
async def test_sigterm_hands_back_what_cannot_finish(settings: Settings, db_url: str) -> None:
    apps.reset()
    async with running_stack(settings, None) as stack:
        worker = await _worker(settings, grace="0.5")
        job_id = await stack.submit("slow", {"seconds": 30})
        await wait_for(db_url, [job_id], statuses=["IN_PROGRESS"], timeout=20)
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 20) == 0
        conn = await tdb.connect(db_url)
        row = await conn.fetchrow(
            "SELECT status::text, retry_count FROM jobs WHERE id = $1", uuid.UUID(job_id)
        )
        await conn.close()
        assert (row["status"], row["retry_count"]) == ("PENDING", 0)  # handed back, no retry used
        # another worker picks it up
        await stack.add_worker(apps.router)
        await wait_for(db_url, [job_id], statuses=["IN_PROGRESS", "COMPLETED"], timeout=20)


async def test_jobs_commands(settings: Settings, db_url: str) -> None:
    env = _env(settings)
    async with running_stack(settings, None) as stack:
        job_id = await stack.submit("noop", {"k": "v"})
        code, out, _ = await _run(["jobs", "show", job_id, "--json"], env)
        assert code == 0 and orjson.loads(out)["payload"] == {"k": "v"}
        code, out, _ = await _run(["jobs", "list", "--status", "PENDING"], env)
        assert code == 0 and job_id in out
        code, out, _ = await _run(["jobs", "cancel", job_id], env)
        assert code == 0 and orjson.loads(out)["status"] == "CANCELLED"
        code, _, err = await _run(["jobs", "cancel", job_id], env)
        assert code == 1 and "CANCELLED" in err
        code, out, _ = await _run(["jobs", "retry", job_id], env)
        assert code == 0 and orjson.loads(out)["status"] == "PENDING"
        code, _, err = await _run(["jobs", "show", str(uuid.uuid4())], env)
        assert code == 1 and "no job" in err


async def test_dlq_list_redrive_purge(settings: Settings, db_url: str) -> None:
    env = _env(settings)
    async with running_stack(settings, apps.router) as stack:
        failed = [await stack.submit("always_fails", max_retries=0) for _ in range(3)]
        await wait_for(db_url, failed, statuses=["FAILED"], timeout=20)
        await stack.workers[0].stop(grace=1)
        stack.workers.clear()
        # the relay has published the three dead-letter copies (its metric, not a sleep)
        registry = stack.relay.metrics.registry
        deadline = time.monotonic() + 20
        while (n := registry.get_sample_value(
            "conveyor_outbox_published_total", {"destination": "dead"}
        ) or 0) < 3:  # fmt: skip
            assert time.monotonic() < deadline, f"{n} dead letters published"
            await asyncio.sleep(0.02)
        code, out, _ = await _run(["dlq", "list", "--json"], env)
        listed = [orjson.loads(line) for line in out.splitlines()]
        assert code == 0 and sorted(d["job_id"] for d in listed) == sorted(failed)
        assert all(d["status"] == "FAILED" and "always fails" in d["error"] for d in listed)
        # one is redriven through the API: its dead-letter copy is stale and is dropped, never
        # redriven a second time
        assert (await stack.client.post(f"/jobs/{failed[0]}/retry")).status_code == 200
        code, out, _ = await _run(["dlq", "redrive", "--id", failed[1]], env)
        assert orjson.loads(out) == {"scanned": 3, "drop": 1, "redrive": 1, "keep": 1}
        conn = await tdb.connect(db_url)
        try:
            rows = await conn.fetch("SELECT id::text, status::text, attempts FROM jobs")
        finally:
            await conn.close()
        by_id = {r["id"]: (r["status"], r["attempts"]) for r in rows}
        assert by_id[failed[0]][0] == "PENDING" and by_id[failed[1]][0] == "PENDING"
        assert by_id[failed[2]] == ("FAILED", 1)
        # a bulk purge asks first; without a terminal it needs --yes and drops nothing
        code, _, err = await _run(["dlq", "purge", "--type", "always_fails"], env)
        assert code == 2 and "Purge 1 of 1 dead letters (type 'always_fails'" in err
        assert "pass --yes" in err and "Traceback" not in err
        code, out, _ = await _run(["dlq", "list"], env)
        assert code == 0 and failed[2] in out and "always fails (attempt 1)" in out
        code, out, _ = await _run(["dlq", "purge", "--type", "always_fails", "--yes"], env)
        assert orjson.loads(out) == {"scanned": 1, "drop": 1}
        code, out, _ = await _run(["dlq", "list", "--json"], env)
        assert code == 0 and out == ""
        code, _, err = await _run(["dlq", "purge"], env)
        assert code == 2 and "--id" in err
        assert re.search("FAILED", by_id[failed[2]][0])


@pytest.mark.timeout(60)
async def test_publisher_and_api_probe_and_shut_down_cleanly(settings: Settings) -> None:
    health = free_port()
    api_port = free_port()
    env = _env(settings, CONVEYOR_AUTH="disabled")  # keys: test_security_processes.py
    publisher = await asyncio.create_subprocess_exec(
        *CONVEYOR, "publisher", "--health-port", str(health), env=env, cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    api = await asyncio.create_subprocess_exec(
        *CONVEYOR, "api", "--port", str(api_port), env=env, cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient() as client:
            for url in (
                f"http://127.0.0.1:{health}/healthz",
                f"http://127.0.0.1:{api_port}/readyz",
            ):
                for _ in range(200):
                    try:
                        r = await client.get(url)
                        if r.status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.05)
                assert r.status_code == 200, url
            assert (await client.get(f"http://127.0.0.1:{health}/readyz")).status_code == 200
            metrics = await client.get(f"http://127.0.0.1:{health}/metrics")
            assert "conveyor_outbox_published" in metrics.text
            job = await client.post(f"http://127.0.0.1:{api_port}/jobs", json={"type": "noop"})
            assert job.status_code == 201
            conn = await tdb.connect(settings.database_url)
            try:
                for _ in range(100):
                    if await conn.fetchval("SELECT count(*) FROM job_outbox") == 0:
                        break
                    await asyncio.sleep(0.05)
                assert await conn.fetchval("SELECT count(*) FROM job_outbox") == 0  # relayed
            finally:
                await conn.close()
    finally:
        for proc in (publisher, api):
            proc.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(p.wait(), 20) for p in (publisher, api)]
    assert codes == [0, 0]
