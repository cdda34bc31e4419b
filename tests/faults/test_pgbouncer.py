"""Every component through PgBouncer in transaction pooling (Debian's pgbouncer 1.18, started
by the test on its own port in front of the shared PostgreSQL), with
``CONVEYOR_DB_POOLER=transaction`` and no direct connection at all (the relay polls instead of
LISTENing): real ``conveyor api``, ``publisher`` (with its maintenance), ``sweeper`` and two
``worker`` processes run singles, a batch, retries through a holding pen, scheduled jobs and
jobs that kill their worker (lease recovery); the checker must report 0 lost, 0 stuck,
0 double-COMPLETED, and no component may log a prepared-statement error.

The control shows the test can fail: asyncpg's named prepared statements (its default) through
the same PgBouncer break."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from conveyor.core.config import Settings
from conveyor.store.connect import connect_options, database_name, listen_url

from .checker import Ledger, check
from .harness import Proc, WorkerFleet, component_env, conveyor_command, fault_settings, http_ok
from .infra import free_port
from .pgbouncer import PrivatePgBouncer


@pytest.fixture
def pgbouncer() -> Iterator[PrivatePgBouncer]:
    b = PrivatePgBouncer(pool_size=20).start()
    yield b
    b.stop()


async def test_named_prepared_statements_break_through_transaction_pooling(db_url: str) -> None:
    """The control: what ``CONVEYOR_DB_POOLER=transaction`` turns off is really needed. Made
    deterministic on a PgBouncer of its own: a client prepares a statement on the only server
    connection, a second client then holds that server in an open transaction, so the first
    client's next query runs on a new server connection, which never saw its statement. (200
    concurrent queries through a pool of 20, the earlier form, failed between 90 and 0 times
    depending on how busy the machine was: PgBouncer hands an idle client its last server.)"""
    bouncer = PrivatePgBouncer(pool_size=2).start()
    try:
        url = bouncer.url(database_name(db_url))
        outcome: dict[str, str] = {}
        for pooler in ("none", "transaction"):
            first = await asyncpg.connect(url, **connect_options(pooler))
            second = await asyncpg.connect(url, **connect_options(pooler))
            try:
                assert await first.fetchval("SELECT $1::int + 1", 1) == 2  # prepared on server A
                async with second.transaction():  # holds server A (the idle one) ...
                    await second.execute("SELECT 1")
                    try:  # ... so this runs on a new server connection B
                        assert await first.fetchval("SELECT $1::int + 1", 2) == 3
                        outcome[pooler] = "ok"
                    except asyncpg.PostgresError as exc:
                        outcome[pooler] = type(exc).__name__
            finally:
                await first.close()
                await second.close()
        assert outcome["none"] != "ok" and outcome["transaction"] == "ok", outcome
    finally:
        bouncer.stop()


def test_listen_goes_direct_or_polls() -> None:
    direct = "postgresql://postgres@db:5432/c"
    pooled = "postgresql://postgres@pgbouncer:6432/c"
    assert listen_url(direct, "none", None) == direct
    assert listen_url(pooled, "transaction", None) is None  # polling
    assert listen_url(pooled, "transaction", direct) == direct
    assert connect_options("transaction") == {"statement_cache_size": 0}
    assert connect_options("none") == {}
    with pytest.raises(ValueError):
        connect_options("session")


# Its statements go through a 20-connection PgBouncer with db_timeout 5 s. Not serial: the
# timeouts once seen under 4 xdist workers (8 of 12 concurrent submits) were JIT-compiled type
# introspection on each new connection, and JIT is off for its database (see below).
@pytest.mark.timeout(180)
async def test_every_component_through_pgbouncer(
    pgbouncer: PrivatePgBouncer, fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    s: Settings = fault_settings(
        fsettings,
        database_url=pgbouncer.url(database_name(fsettings.database_url)),
        db_pooler="transaction",
        db_timeout=5.0,  # a shared 2-core machine: this test is about pooling, not latency
    )
    # JIT off on the server side, as docs/scaling.md, "PgBouncer", asks (a pooler passes no startup
    # setting; this test connects as postgres, so its database, not a role): with JIT on, each
    # new connection JIT-compiled asyncpg's type introspection for ~1 s of CPU, and under a
    # loaded parallel run 8 of 12 concurrent submits on fresh API connections passed the 5 s
    # statement timeout (1-2 s introspections are common here)
    direct = await asyncpg.connect(fsettings.database_url)
    try:
        await direct.execute(
            f'ALTER DATABASE "{database_name(fsettings.database_url)}" SET jit = off'
        )
    finally:
        await direct.close()
    env = component_env(s)
    port = free_port()
    procs = [
        Proc("api", [*conveyor_command(), "api", "--port", str(port)], env, tmp_path).start(),
        Proc("publisher", [*conveyor_command(), "publisher"], env, tmp_path).start(),
        Proc("sweeper", [*conveyor_command(), "sweeper"], env, tmp_path).start(),
    ]
    fleet = WorkerFleet(s, tmp_path, 2, concurrency=8)
    stop = asyncio.Event()
    supervisor = asyncio.create_task(fleet.supervise(stop))
    accepted: list[str] = []
    try:
        await http_ok(port)
        await procs[1].wait_for_log("publisher_started")
        await fleet.ready()
        await _only_through(pgbouncer, fsettings.database_url)
        limits = httpx.Limits(keepalive_expiry=2)  # under uvicorn's 5 s (see tests/stack.py)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=30, limits=limits
        ) as client:

            async def submit(job_type: str, **extra: object) -> None:
                payload = {"ledger": str(ledger), "sleep": 0.02}
                r = await client.post("/jobs", json={"type": job_type, "payload": payload, **extra})
                assert r.status_code == 201, r.text
                accepted.append(r.json()["id"])

            for wave in range(6):
                await asyncio.gather(*(submit("work") for _ in range(12)))
                await submit("flaky")  # first attempt fails: a 4 s holding pen, then done
                await submit("work", delay_seconds=1)  # SCHEDULED, promoted by the sweeper
                if wave == 2:
                    await submit("suicide")  # kills its worker: lease recovery, then FAILED
            body = {"jobs": [{"type": "sync_work", "payload": {"ledger": str(ledger)}}] * 100}
            r = await client.post("/jobs/batch", json=body)
            assert r.status_code == 201, r.text
            accepted += [j["id"] for j in r.json()["jobs"]]
        v = await check(s.database_url.replace(
            f":{pgbouncer.port}/", f":{_upstream_port(pgbouncer)}/"
        ), accepted, ledger, label="pgbouncer", timeout=90)  # fmt: skip
    finally:
        stop.set()
        await supervisor
        await fleet.stop()
        for p in procs:
            await p.stop()
    v.assert_clean(expect=None)
    assert v.by_status == {"COMPLETED": len(accepted) - 1, "FAILED": 1}, v.by_status
    assert len(set(accepted)) == len(accepted) == 6 * 14 + 1 + 100
    assert fleet.deaths >= 2  # the suicide really killed a worker (one per attempt)
    logs = "\n".join(p.log() for p in [*procs, *fleet.slots])
    for text in ("prepared statement", "InvalidSQLStatementName", "DuplicatePreparedStatement"):
        assert text not in logs, text


async def _only_through(b: PrivatePgBouncer, direct_url: str) -> None:
    """Every backend of the test database is one of PgBouncer's server connections, and the
    five processes are PgBouncer's clients (no component connected directly)."""
    db = database_name(direct_url)
    clients = [r.split("|") for r in b.show("CLIENTS").splitlines()]
    servers = [r.split("|") for r in b.show("SERVERS").splitlines()]
    assert sum(1 for c in clients if c[2] == db) >= 5, clients
    via = {int(s[7]) for s in servers if s[2] == db}
    conn = await asyncpg.connect(direct_url)
    try:
        ports = await conn.fetch(
            "SELECT client_port FROM pg_stat_activity WHERE datname = $1"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            db,
        )
    finally:
        await conn.close()
    assert ports and {r["client_port"] for r in ports} <= via, (ports, servers)


def _upstream_port(b: PrivatePgBouncer) -> int:
    return b.upstream[1]
