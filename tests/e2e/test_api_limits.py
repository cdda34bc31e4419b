"""Batch limits enforced before the jobs are built, long statements that are
not outages, 503s that say why, and Idempotency-Key on batches."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from conveyor.core.config import Settings

from ..stack import Stack, free_port, running_stack
from .test_api_contract import running_stack_api_only


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    async with running_stack(settings, None, maintenance=False, relays=0) as s:
        yield s


def _tiny_items(n: int) -> bytes:
    return b'{"jobs":[' + b"{}," * (n - 1) + b"{}]}"


async def test_a_million_item_batch_is_refused_quickly_and_briefly(
    stack: Stack, db: asyncpg.Connection
) -> None:
    body = _tiny_items(1_000_000)
    t0 = time.monotonic()
    r = await stack.client.post(
        "/jobs/batch", content=body, headers={"content-type": "application/json"}
    )
    took = time.monotonic() - t0
    assert r.status_code == 422 and r.json()["error"] == "too_many_jobs", r.text[:200]
    assert len(r.content) < 1000
    assert took < 1.0, took
    assert await db.fetchval("SELECT count(*) FROM jobs") == 0


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def test_a_64mib_batch_of_tiny_items_is_refused_fast_in_bounded_memory(
    settings: Settings,
) -> None:
    """A real ``conveyor api`` process: the refusal's time and the process's peak RSS (printed
    for the issue's closing note), while /healthz keeps answering."""
    port = free_port()
    env = {
        **os.environ,
        "CONVEYOR_DATABASE_URL": settings.database_url,
        "CONVEYOR_NAMESPACE": settings.namespace,
        "CONVEYOR_AMQP_URL": settings.amqp_url,
        "CONVEYOR_AUTH": "disabled",  # limits, not keys, are tested here
    }
    cmd = [sys.executable, "-m", "conveyor.cli", "api", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            for _ in range(200):
                try:
                    if (await c.get("/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    await asyncio.sleep(0.05)
            before = _peak_rss_kib(proc.pid)
            body = _tiny_items((64 * 1024 * 1024 - 20) // 3)
            assert len(body) <= 64 * 1024 * 1024
            health: list[float] = []
            codes: list[int] = []
            done = threading.Event()

            def probe() -> None:
                # its own thread and connection: the upload below keeps this test's event loop
                # busy, which must not be counted as the server's latency
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as pc:
                    while not done.is_set():
                        t = time.monotonic()
                        codes.append(pc.get("/healthz").status_code)
                        health.append(time.monotonic() - t)
                        time.sleep(0.02)

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            t0 = time.monotonic()
            r = await c.post(
                "/jobs/batch", content=body, headers={"content-type": "application/json"}
            )
            took = time.monotonic() - t0
            done.set()
            await asyncio.to_thread(prober.join, 30)
            peak = _peak_rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"[api] 64 MiB batch of {len(body) // 3} tiny items: {r.status_code} in {took:.3f}s; "
          f"API peak RSS {before / 1024:.0f} -> {peak / 1024:.0f} MiB; slowest /healthz "
          f"{max(health, default=0):.3f}s")  # fmt: skip
    assert r.status_code == 422 and r.json()["error"] == "too_many_jobs"
    assert len(r.content) < 1000
    # the time is mostly this process's upload, which the server reads and drops (parsing the
    # 22 million items would take far longer than the bound)
    assert took < 5.0, took
    assert peak - before < 48 * 1024, (before, peak)  # the 64 MiB body is never held
    assert codes and set(codes) == {200}, codes
    assert max(health, default=0) < 1.0


@pytest.mark.serial  # its bound is the liveness probe's 0.2 s on a loaded machine
async def test_a_batch_at_the_limits_is_accepted_not_a_503(settings: Settings) -> None:
    """1,000 jobs of 62 KB: the insert outlives a short command timeout (0.3 s here, 1.5 s by
    default), which must not turn into 'database unavailable'."""
    tight = settings.model_copy(update={"db_timeout": 0.3})
    jobs = [{"type": "work", "payload": {"blob": f"{i:06d}" + "x" * 62_000}} for i in range(1000)]
    async with running_stack(tight, None, maintenance=False, relays=0) as s:
        r = await s.client.post("/jobs/batch", json={"jobs": jobs}, timeout=120)
        assert r.status_code == 201, r.text[:300]
        assert [j["payload"]["blob"][:6] for j in r.json()["jobs"]] == [
            f"{i:06d}" for i in range(1000)
        ]


async def test_every_503_is_logged_with_its_cause(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    dead = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/none"})
    caplog.set_level(logging.WARNING, logger="conveyor.api")
    async with running_stack_api_only(dead) as client:
        r = await client.post("/jobs/batch", json={"jobs": [{"type": "t"}]})
        assert r.status_code == 503
    causes = [getattr(rec, "fields", {}).get("cause") for rec in caplog.records]
    assert "acquire" in causes, [rec.getMessage() for rec in caplog.records]


async def test_batch_idempotency_key(stack: Stack, db: asyncpg.Connection) -> None:
    body = {"jobs": [{"type": "a", "payload": {"i": i}} for i in range(3)]}
    h = {"Idempotency-Key": "batch-7"}
    first = await stack.client.post("/jobs/batch", json=body, headers=h)
    again = await stack.client.post("/jobs/batch", json=body, headers=h)
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert [j["id"] for j in first.json()["jobs"]] == [j["id"] for j in again.json()["jobs"]]
    other = {"jobs": [*body["jobs"], {"type": "a"}]}
    r = await stack.client.post("/jobs/batch", json=other, headers=h)
    assert r.status_code == 409 and r.json()["error"] == "idempotency_conflict"
    changed = {"jobs": [{"type": "a", "payload": {"i": 9}}]}
    assert (await stack.client.post("/jobs/batch", json=changed, headers=h)).status_code == 409
    # the same key on a single submit is a different request, not a collision
    assert (await stack.client.post("/jobs", json={"type": "a"}, headers=h)).status_code == 201
    assert await db.fetchval("SELECT count(*) FROM jobs") == 4

    same = {"jobs": [{"type": "c", "payload": {"i": i}} for i in range(20)]}
    answers = await asyncio.gather(
        *(
            stack.client.post("/jobs/batch", json=same, headers={"Idempotency-Key": "many"})
            for _ in range(32)
        )
    )
    codes = sorted(a.status_code for a in answers)
    # one creates the jobs, every other answers them; on a loaded machine some of the 32 may
    # find no database connection within the API's fail-fast bound (503, nothing written)
    assert codes.count(201) == 1 and set(codes) <= {200, 201, 503}, codes
    answered = [a for a in answers if a.status_code != 503]
    assert len({tuple(j["id"] for j in a.json()["jobs"]) for a in answered}) == 1
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE job_type = 'c'") == 20
