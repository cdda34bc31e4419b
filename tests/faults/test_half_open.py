"""Half-open database connections: a TCP proxy between a component and
PostgreSQL blackholes — connections stay open and nothing answers. Without a command timeout a
duty waits for ever while the process looks healthy. With one, the pass fails, liveness says
so, and the component recovers by itself when the network heals: the sweeper promotes a due
job again (checked as a promoted job, not only /healthz, which a sweeper whose duties never
resumed could still pass)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from conveyor import JobSpec, enqueue_many
from conveyor.core.config import Settings
from conveyor.publisher.relay import Relay

from .. import db as tdb
from .harness import Proc, component_env, conveyor_command, fault_settings, http_ok
from .infra import free_port
from .proxy import Proxy


@pytest.fixture
async def pg_proxy(fsettings: Settings) -> AsyncIterator[Proxy]:
    parts = urlsplit(fsettings.database_url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    yield proxy
    await proxy.close()


def through(settings: Settings, proxy: Proxy, **overrides: float) -> Settings:
    parts = urlsplit(settings.database_url)
    netloc = f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}"
    url = urlunsplit(parts._replace(netloc=netloc))
    return fault_settings(settings, database_url=url, **overrides)


async def _health(port: int) -> tuple[int, dict[str, object]]:
    async with httpx.AsyncClient(timeout=2) as client:
        r = await client.get(f"http://127.0.0.1:{port}/healthz")
        return r.status_code, dict(r.json())


async def _until(port: int, status: int, timeout: float) -> float:
    """Seconds until ``/healthz`` answers ``status``."""
    start = time.monotonic()
    while True:
        code, details = await _health(port)
        if code == status:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"/healthz still {code} after {timeout}s: {details}")
        await asyncio.sleep(0.1)


async def _promoted(
    db: asyncpg.Connection, *, timeout: float, also: Sequence[uuid.UUID] = ()
) -> None:
    """A job due in 0.2 s is promoted by the sweeper within ``timeout`` (and ``also``)."""
    ids = [*also, *await enqueue_many(db, [JobSpec("t", delay_seconds=0.2)])]
    deadline = time.monotonic() + timeout
    while True:
        statuses = await db.fetch("SELECT status::text FROM jobs WHERE id = ANY($1::uuid[])", ids)
        if {r["status"] for r in statuses} == {"PENDING"}:
            return
        assert time.monotonic() < deadline, f"not promoted: {[r['status'] for r in statuses]}"
        await asyncio.sleep(0.1)


@pytest.mark.timeout(90)
async def test_sweeper_liveness_fails_on_a_half_open_connection_and_recovers(
    fsettings: Settings, pg_proxy: Proxy, tmp_path: Path
) -> None:
    settings = through(fsettings, pg_proxy, command_timeout=1.0, maintenance_deadline=2.0)
    port = free_port()
    args = [*conveyor_command(), "sweeper", "--health-port", str(port)]
    proc = Proc("sweeper", args, component_env(settings), tmp_path).start()
    db = await tdb.connect(fsettings.database_url)  # the test's own, not through the proxy
    try:
        await http_ok(port)
        await _promoted(db, timeout=10)  # its duties run
        pg_proxy.blackhole()
        went_down = await _until(port, 503, timeout=20)
        _, details = await _health(port)
        stuck = await enqueue_many(db, [JobSpec("t", delay_seconds=0.2)])
        await asyncio.sleep(1.0)  # several promotion intervals: nothing reaches the database
        assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", stuck[0]) == (
            "SCHEDULED"
        )
        # /healthz turns 503 when a pass overruns its deadline, which on a loaded machine can
        # come before the 1 s command_timeout has failed the pass: heal only once it has
        deadline = time.monotonic() + 20
        while "maintenance_failed" not in proc.log():
            assert time.monotonic() < deadline, proc.log()[-2000:]
            await asyncio.sleep(0.1)
        pg_proxy.heal()
        came_back = await _until(port, 200, timeout=30)
        # a green /healthz is not enough: the duties run again (the job due meanwhile too)
        await _promoted(db, timeout=10, also=stuck)
        assert proc.alive(), proc.log()[-2000:]
    finally:
        await db.close()
        await proc.stop()
    print(f"[faults] half-open sweeper: /healthz 503 after {went_down:.1f}s of blackhole, "
          f"200 again {came_back:.1f}s after healing; {details}")  # fmt: skip
    assert "maintenance_failed" in proc.log()


@pytest.mark.timeout(60)
async def test_relay_pass_fails_fast_on_a_half_open_connection_and_recovers(
    fsettings: Settings, pg_proxy: Proxy
) -> None:
    relay = Relay(through(fsettings, pg_proxy, command_timeout=1.0))
    await relay.start()
    try:
        assert await relay.run_once() == 0  # a pooled connection through the proxy
        pg_proxy.blackhole()
        start = time.monotonic()
        with pytest.raises((TimeoutError, OSError)):
            await asyncio.wait_for(relay.run_once(), 20)
        failed_after = time.monotonic() - start
        pg_proxy.heal()
        deadline = time.monotonic() + 20
        while True:
            try:
                assert await asyncio.wait_for(relay.run_once(), 20) == 0
                break
            except (TimeoutError, OSError):
                assert time.monotonic() < deadline, "the relay did not recover"
                await asyncio.sleep(0.2)
    finally:
        await relay.close()
    assert failed_after < 5, f"the pass hung {failed_after:.1f}s"
