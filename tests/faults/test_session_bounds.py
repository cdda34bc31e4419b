"""Gray failures of the relay and the session bounds: a process that *pauses* (frozen
VM, long GC, partition, lost host) keeps its connection open and its locks held, and PostgreSQL
cannot tell it from a slow client. Conveyor's own sessions carry bounds PostgreSQL enforces
(``store/bounds.py``), so a paused peer's locks are released within seconds and a healthy peer
takes over.

- a real publisher process SIGSTOPped inside its relay transaction (its batch's outbox rows
  deleted, uncommitted, locked) beside a healthy relay, sweeper and worker: every job completes
  within the bound, and the stale batch it publishes after SIGCONT is dropped at claim;
- every component's pooled connections carry the bounds (read back from the connections);
- without the bound (0), the reconciler copies the rows the frozen relay holds (one step, and
  end to end);
- a relay partitioned from PostgreSQL mid-batch (``proxy.py`` blackholes its connection): the
  server cuts the session and the rows go back to the outbox within the bound;
- a host that vanishes (a network namespace whose link goes down): the keepalives end its
  session, which held a lock outside any transaction."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from conveyor import enqueue
from conveyor.api.service import Api
from conveyor.core.config import Settings
from conveyor.core.metrics import Metrics
from conveyor.maintenance.sweeper import Sweeper
from conveyor.publisher.relay import Relay
from conveyor.store.connect import create_pool, database_name
from conveyor.worker.worker import Worker

from .. import db as tdb
from ..stack import wait_for
from . import netns
from .apps import router
from .checker import Ledger, check
from .harness import Proc, component_env, running
from .infra import PrivatePostgres
from .proxy import Proxy

# the documented defaults (docs/configuration.md), in pg_settings' units (ms, or s for the
# keepalives); the API's statement bound stays above its batch insert's own 300 s limit
BOUNDS = {
    "idle_in_transaction_session_timeout": "5000",
    "lock_timeout": "10000",
    "statement_timeout": "60000",
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
TAKEOVER_BOUND = 30.0  # seconds from the freeze to every job COMPLETED


async def _settings_of(pool: Any) -> dict[str, str]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])", list(BOUNDS)
        )
        assert await conn.fetchval("SELECT inet_client_port()") is not None  # TCP, not a socket
    return {r["name"]: r["setting"] for r in rows}


async def _held_outbox_rows(db_url: str) -> tuple[int, int]:
    """(outbox rows, of them locked by another transaction)."""
    conn = await tdb.connect(db_url, timeout=10)
    try:
        async with conn.transaction():
            total = await conn.fetchval("SELECT count(*) FROM job_outbox")
            free = await conn.fetchval(
                "SELECT count(*) FROM (SELECT id FROM job_outbox FOR UPDATE SKIP LOCKED) f"
            )
    finally:
        await conn.close()
    return int(total), int(total) - int(free)


def _total(counter: object) -> int:
    samples = (s for m in counter.collect() for s in m.samples)  # type: ignore[attr-defined]
    return int(sum(s.value for s in samples if s.name.endswith("_total")))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("bound", ["idle_bound", "no_bound"])
async def test_a_publisher_frozen_in_its_relay_transaction_is_taken_over(
    fsettings: Settings, ledger: Ledger, tmp_path: Path, bound: str
) -> None:
    """``idle_bound``: the frozen relay's session is ended by the server (5 s), its rows go back
    to the outbox (the reconciler passes every 15 s: too slow to be the one). ``no_bound``: the
    frozen relay runs without the bound (``CONVEYOR_DB_IDLE_IN_TRANSACTION_TIMEOUT=0``, as a
    pooler without the role settings would) and the reconciler, passing every second, copies the
    rows it finds held at two passes; the frozen relay later commits its stale batch."""
    settings = fsettings.model_copy(update={"relay_batch": 20, "reconcile_interval": 15.0})
    victim_settings = settings
    if bound == "no_bound":
        settings = settings.model_copy(update={"reconcile_interval": 1.0})
        victim_settings = settings.model_copy(update={"db_idle_in_transaction_timeout": 0.0})
    victim = Proc("frozen-publisher", [sys.executable, "-m", "tests.faults.pausing_publisher"],
                  component_env(victim_settings), tmp_path).start()  # fmt: skip
    try:
        await victim.wait_for_log("pausing_publisher: started", 30)
        async with running(settings, routers=[router], concurrency=16, relays=1) as stack:

            def payload(i: int) -> dict[str, Any]:
                return {"ledger": str(ledger), "sleep": 0.01}

            deadline = time.monotonic() + 30
            while "frozen holding" not in victim.log():  # whichever relay wakes first
                assert time.monotonic() < deadline, victim.log()[-2000:]
                await stack.submit_batch("work", [payload(i) for i in range(20)])
                await asyncio.sleep(0.3)
            frozen_at = time.monotonic()
            await asyncio.sleep(1)  # the healthy relay drains what is not held
            _, held = await _held_outbox_rows(settings.database_url)
            assert held > 0, "the frozen publisher holds no outbox rows"
            await stack.submit_many(100, "work", payload, parallel=10, pace=0.05)
            # every job COMPLETED (the held rows themselves stay in the outbox, uncommitted,
            # until the frozen relay resumes or loses its session)
            await wait_for(settings.database_url, stack.accepted, ("COMPLETED",),
                           timeout=TAKEOVER_BOUND)  # fmt: skip
            took = time.monotonic() - frozen_at
            print(f"[faults] frozen relay ({bound}): {held} rows held, every job COMPLETED "
                  f"{took:.1f} s after the freeze")  # fmt: skip

            # SIGCONT: it publishes its stale batch (the jobs ran meanwhile), then finds its
            # session ended by the server, or (no bound) commits its delete
            dropped = _total(stack.workers[0].metrics.messages_dropped)
            victim.signal(signal.SIGCONT)
            await victim.wait_for_log("pausing_publisher: resumed", 10)
            if bound == "idle_bound":
                await victim.wait_for_log("relay_error", 20)
            # the stale batch's way to the worker is the resumed process's publish and the
            # worker's consumption, no bound of Conveyor's: a generous wait, for a loaded machine
            deadline = time.monotonic() + 40
            while _total(stack.workers[0].metrics.messages_dropped) - dropped < held:
                assert time.monotonic() < deadline, "the stale batch never reached the worker"
                await asyncio.sleep(0.1)
            after = await check(settings.database_url, stack.accepted, ledger,
                                label=f"relay-frozen-{bound}", timeout=20,
                                quiet=1.0)  # fmt: skip
        after.extra.update(held=held, took_over_s=round(took, 1))
        after.assert_clean()
        assert after.outbox_left == 0
        assert after.executed == len(stack.accepted) and after.duplicates_executed == 0
    finally:
        victim.signal(signal.SIGCONT)
        await victim.stop()


async def test_every_component_pool_carries_the_session_bounds(fsettings: Settings) -> None:
    """Read back from each component's own pooled connection; the application's connection
    (``enqueue()``) and a transaction pooler's connections carry none of them."""
    api = Api(fsettings, Metrics())
    relay = Relay(fsettings)
    sweeper = Sweeper(fsettings)
    worker = Worker(fsettings, router, concurrency=1)
    seen: dict[str, dict[str, str]] = {}
    try:
        for name, part in (("api", api), ("publisher", relay), ("sweeper", sweeper),
                           ("worker", worker)):  # fmt: skip
            await part.start()
            seen[name] = await _settings_of(part.pool)
    finally:
        await worker.stop(grace=1)
        for closing in (sweeper.close(), relay.close(), api.stop()):
            with contextlib.suppress(Exception):
                await closing
    expected = {name: dict(BOUNDS) for name in seen}
    expected["api"]["statement_timeout"] = "330000"
    # the relay's covers its wait for confirms (10 s) too (``bounds.relay_idle_floor``)
    expected["publisher"]["idle_in_transaction_session_timeout"] = "15000"
    assert seen == expected

    app_conn = await tdb.connect(fsettings.database_url)
    pooled = await create_pool(fsettings.database_url, application_name="t", max_size=1,
                               pooler="transaction")  # fmt: skip
    try:
        async with app_conn.transaction():
            await enqueue(app_conn, "work", {})
            assert await app_conn.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
        assert (await _settings_of(pooled))["idle_in_transaction_session_timeout"] == "0"
    finally:
        await app_conn.close()
        await pooled.close()


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


@pytest.mark.timeout(60)
async def test_a_relay_partitioned_mid_batch_loses_its_rows_within_the_bound(
    fsettings: Settings,
) -> None:
    """The relay's connection goes silent (blackholed) after it took a batch: its outbox rows
    stay locked until PostgreSQL ends the session, ``db_idle_in_transaction_timeout`` plus the
    relay's publish wait (2 + 2 s here) later; a keepalive cannot see this partition (the
    proxy's socket answers), the idle bound does."""
    bound = 2.0 + 2.0  # the relay's idle floor: its publish wait (2 s) + the bound (2 s)
    host = urlsplit(fsettings.database_url)
    proxy = Proxy(host.hostname or "127.0.0.1", host.port or 5432)
    port = await proxy.start()
    settings = fsettings.model_copy(update={
        "database_url": _via(fsettings.database_url, port),
        "db_idle_in_transaction_timeout": 2.0,
    })  # fmt: skip
    conn = await tdb.connect(fsettings.database_url)
    try:
        async with conn.transaction():
            for i in range(5):
                await enqueue(conn, "work", {"i": i})
    finally:
        await conn.close()

    relay = Relay(settings, publish_timeout=2.0)
    taken = asyncio.Event()
    publish_batch = relay.publisher.publish_batch

    async def partitioned(rows: Sequence[Any], *args: Any) -> list[BaseException | None]:
        proxy.blackhole()
        taken.set()
        await asyncio.Event().wait()  # the partition outlasts the test
        return await publish_batch(rows, *args)

    relay.publisher.publish_batch = partitioned  # type: ignore[method-assign]
    await relay.start()
    step = asyncio.create_task(relay.run_once())
    try:
        await asyncio.wait_for(taken.wait(), 10)
        started = time.monotonic()
        assert await _held_outbox_rows(fsettings.database_url) == (5, 5)
        while (await _held_outbox_rows(fsettings.database_url))[1]:
            assert time.monotonic() - started < 15, "the partitioned session still holds its rows"
            await asyncio.sleep(0.1)
        released = time.monotonic() - started
        print(f"[faults] partitioned relay: rows released {released:.1f} s after the partition "
              f"(bound {bound} s)")  # fmt: skip
        assert released < bound + 3
        assert await _held_outbox_rows(fsettings.database_url) == (5, 0)
        check_conn = await tdb.connect(fsettings.database_url)
        try:
            left = await check_conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
                " AND application_name = 'conveyor-publisher'",
                database_name(fsettings.database_url),
            )
        finally:
            await check_conn.close()
        assert left == 0, "the partitioned backend is still there"
    finally:
        await proxy.close()  # first: the step's rollback must not wait on the blackhole
        step.cancel()
        with contextlib.suppress(BaseException):
            await step
        await relay.close()


async def test_the_reconciler_copies_outbox_rows_a_stopped_relay_holds(
    fsettings: Settings,
) -> None:
    """One step at a time: a transaction holds the relay's take of the outbox (no bound on
    this test's own connection); the reconciler copies the rows it finds held at two passes
    in a row, once, and leaves free rows and a relay's short hold alone."""
    conn = await tdb.connect(fsettings.database_url)
    holder = await tdb.connect(fsettings.database_url)
    sweeper = Sweeper(fsettings)
    await sweeper.start()
    try:
        async with conn.transaction():
            held_jobs = [await enqueue(conn, "work", {"i": i}) for i in range(3)]
        async with conn.transaction():
            free_jobs = [await enqueue(conn, "work", {"i": i}) for i in range(2)]
        take = holder.transaction()
        await take.start()
        rows = await holder.fetch(
            "DELETE FROM job_outbox WHERE id = ANY(ARRAY(SELECT id FROM job_outbox"
            " ORDER BY id LIMIT 3 FOR UPDATE SKIP LOCKED)) RETURNING job_id"
        )
        assert sorted(r["job_id"] for r in rows) == sorted(held_jobs)

        assert await sweeper.stranded.step(sweeper.pool) == 0  # a suspect, not yet stranded
        assert await sweeper.stranded.step(sweeper.pool) == 3
        assert await sweeper.stranded.step(sweeper.pool) == 0  # copied once
        copies = await conn.fetch("SELECT job_id FROM job_outbox ORDER BY id")
        # the held rows (still visible, deleted uncommitted), the free ones, the copies
        assert sorted(r["job_id"] for r in copies) == sorted([*held_jobs, *held_jobs, *free_jobs])
        await take.rollback()
    finally:
        await holder.close()
        await conn.close()
        await sweeper.close()


# --------------------------------------------------------------------------- a real partition


# a component's pool in a network namespace: the sweeper's, holding a session-level advisory
# lock (as good as any lock: a session not in a transaction, which only the TCP bounds reach)
_HOLDER = """
import asyncio, sys
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper

async def main() -> None:
    sweeper = Sweeper(Settings(database_url=sys.argv[1]))
    await sweeper.start()
    async with sweeper.pool.acquire() as conn:
        await conn.fetchval("SELECT pg_advisory_lock(2323)")
        print("locked", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.timeout(90)
@pytest.mark.skipif(not netns.available(), reason="needs root and ip")
async def test_a_partitioned_host_is_dropped_by_the_keepalives(tmp_path: Path) -> None:
    """A component on a host that vanishes (its end of a veth pair goes down: nothing answers,
    nothing resets) while its session holds a lock: PostgreSQL's keepalives (5 s idle, 3 probes
    2 s apart) and ``tcp_user_timeout`` (10 s) end the session in about 11 s instead of the
    kernel's default two hours (each bound alone, inside a transaction or not:
    ``test_link_partition.py``)."""
    link = netns.Link()
    pg = PrivatePostgres()
    holder: subprocess.Popen[bytes] | None = None
    try:
        pg.start()
        link.create()
        pg.reach_from(link.host_ip, link.ns_ip)
        with (tmp_path / "holder.log").open("wb") as out:
            holder = subprocess.Popen(
                [*link.exec_prefix(), sys.executable, "-c", _HOLDER,
                 f"postgresql://postgres@{link.host_ip}:{pg.port}/postgres"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while b"locked" not in (tmp_path / "holder.log").read_bytes():
            assert holder.poll() is None, (tmp_path / "holder.log").read_text()
            assert time.monotonic() < deadline, "the holder never took its lock"
            await asyncio.sleep(0.1)
        conn = await asyncpg.connect(pg.url(), timeout=10)
        try:
            assert not await conn.fetchval("SELECT pg_try_advisory_lock(2323)")
            link.down()  # the partition
            started = time.monotonic()
            while not await conn.fetchval("SELECT pg_try_advisory_lock(2323)"):
                assert time.monotonic() - started < 25, "the vanished session still holds its lock"
                await asyncio.sleep(0.2)
            dropped = time.monotonic() - started
        finally:
            await conn.close()
        print(f"[faults] partitioned host: its session ended {dropped:.1f} s after the partition")
        assert dropped < 20
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(10)
        with contextlib.suppress(Exception):
            pg.stop()
        link.close()
