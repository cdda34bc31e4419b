"""The session bounds behind PgBouncer in transaction pooling, where Conveyor sends none of them
(PgBouncer refuses unknown startup parameters): ``conveyor migrate --create-roles`` writes them
on the component roles (``ALTER ROLE … SET``), and PgBouncer opens each client's server
connections as that client's user, so the role's settings apply there.

On a PostgreSQL cluster of the test's own (roles are cluster-wide), with the bounds at 1 s:

- each component's pool, as its role through PgBouncer, reads back its role's bounds;
- behaviour, through the API's pool: a transaction left idle is ended by the server (its row
  lock released about a second later, the next statement an outage), and a cancel waiting for a
  row lock another transaction holds answers 503 (``LockNotAvailableError``) about a second later;
- the control: a ``[databases]`` entry that forces one server user (``user=postgres``) makes
  every server connection as that user, and the component roles' bounds never apply."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from conveyor import enqueue
from conveyor.api.service import Api
from conveyor.core.config import Settings
from conveyor.core.errors import ServiceUnavailable
from conveyor.core.metrics import Metrics
from conveyor.store.bounds import component_bounds
from conveyor.store.connect import create_pool, is_unavailable
from conveyor.store.roles import COMPONENTS, DEFAULT_ROLES

from .. import db as tdb
from .harness import conveyor_command
from .infra import PrivatePostgres
from .pgbouncer import PrivatePgBouncer

DATABASE = "conveyor_bounds"
BOUND = 1.0  # CONVEYOR_DB_IDLE_IN_TRANSACTION_TIMEOUT and CONVEYOR_DB_LOCK_TIMEOUT
NAMES = ("idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout",
         "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
         "tcp_user_timeout")  # fmt: skip


def _settings(url: str, **kw: Any) -> Settings:
    bounds = Settings(database_url=url, db_idle_in_transaction_timeout=BOUND, db_lock_timeout=BOUND)
    return bounds.model_copy(update=kw)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivatePostgres]:
    """Migrated, its component roles created by the real ``conveyor migrate --create-roles``
    with the bounds at ``BOUND`` (the cluster trusts every local login: PgBouncer's server
    logins need no password here)."""
    pg = PrivatePostgres()
    pg.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
        env |= {f"CONVEYOR_{c.upper()}_DB_PASSWORD": f"pw-{c}" for c in COMPONENTS}
        env |= {"CONVEYOR_DATABASE_URL": pg.url(DATABASE),
                "CONVEYOR_DB_IDLE_IN_TRANSACTION_TIMEOUT": str(BOUND),
                "CONVEYOR_DB_LOCK_TIMEOUT": str(BOUND)}  # fmt: skip
        done = subprocess.run([*conveyor_command(), "migrate", "--create-roles"], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        asyncio.run(tdb.register_test_types(pg.url(DATABASE)))
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def bouncer(cluster: PrivatePostgres) -> Iterator[PrivatePgBouncer]:
    b = PrivatePgBouncer(port=cluster.port, pool_size=4, users=list(DEFAULT_ROLES.values()))
    yield b.start()
    b.stop()


async def _seen(url: str, component: str) -> dict[str, str]:
    """The bounds on a server connection of ``component``'s pool (``create_pool`` as the
    component calls it, behind a transaction pooler), and the user it logged in as."""
    bounds = component_bounds(_settings(url))[component]
    pool = await create_pool(url, application_name=f"conveyor-{component}", max_size=1,
                             pooler="transaction", bounds=bounds)  # fmt: skip
    try:
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])", list(NAMES)
            )
            user = await conn.fetchval("SELECT current_user")
    finally:
        await pool.close()
    return {"user": user, **{r["name"]: r["setting"] for r in rows}}


async def test_each_component_role_carries_its_bounds_through_pgbouncer(
    bouncer: PrivatePgBouncer,
) -> None:
    settings = _settings(bouncer.url(DATABASE))
    for component, role in DEFAULT_ROLES.items():
        seen = await _seen(bouncer.url(DATABASE, role), component)
        expected = component_bounds(settings)[component].server_settings()
        assert seen == {"user": role, **expected}, component
        assert seen["lock_timeout"] == "1000"
    servers = {r.split("|")[1] for r in bouncer.show("SERVERS").splitlines() if r}
    assert servers == set(DEFAULT_ROLES.values()), servers  # every one through PgBouncer


async def test_one_forced_server_user_loses_the_roles_bounds(cluster: PrivatePostgres) -> None:
    """The control: ``user=postgres`` in the ``[databases]`` entry."""
    b = PrivatePgBouncer(port=cluster.port, users=list(DEFAULT_ROLES.values()),
                         server_user="postgres").start()  # fmt: skip
    try:
        seen = await _seen(b.url(DATABASE, DEFAULT_ROLES["api"]), "api")
    finally:
        b.stop()
    assert seen["user"] == "postgres"
    assert seen["lock_timeout"] == seen["idle_in_transaction_session_timeout"] == "0", seen


@pytest.fixture
async def api(bouncer: PrivatePgBouncer) -> AsyncIterator[Api]:
    """The API's pool as ``conveyor_api`` through PgBouncer; a command timeout (4 s) above the
    bound, so only the bound can answer within it."""
    url = bouncer.url(DATABASE, DEFAULT_ROLES["api"])
    part = Api(_settings(url, db_pooler="transaction", db_timeout=4.0), Metrics())
    await part.start()
    yield part
    await part.stop()


async def _a_job(cluster: PrivatePostgres) -> tuple[asyncpg.Connection, uuid.UUID]:
    """A direct superuser connection, and a PENDING job it inserted."""
    conn = await asyncpg.connect(cluster.url(DATABASE))
    return conn, uuid.UUID(str(await enqueue(conn, "work", {})))


async def test_an_idle_transaction_through_pgbouncer_is_ended_after_the_bound(
    cluster: PrivatePostgres, api: Api
) -> None:
    direct, job = await _a_job(cluster)
    try:
        async with api.pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await conn.fetch("SELECT 1 FROM conveyor.jobs WHERE id = $1 FOR UPDATE", job)
            idle_from = time.monotonic()  # the client now does nothing, as a frozen one would
            while True:
                async with direct.transaction():
                    try:
                        await direct.fetch(
                            "SELECT 1 FROM conveyor.jobs WHERE id = $1 FOR UPDATE NOWAIT", job
                        )
                        break
                    except asyncpg.LockNotAvailableError:
                        pass
                assert time.monotonic() - idle_from < BOUND + 4, "the idle session keeps its lock"
                await asyncio.sleep(0.1)
            released = time.monotonic() - idle_from
            with pytest.raises(Exception) as failed:
                await conn.fetchval("SELECT 1")
            assert is_unavailable(failed.value), repr(failed.value)  # an outage: retried
            with pytest.raises(Exception):  # noqa: B017 - the connection is gone, as expected
                await tx.rollback()
    finally:
        await direct.close()
    print(f"[faults] through PgBouncer: an idle transaction's lock released {released:.2f} s "
          f"after its last statement (role bound {BOUND} s)")  # fmt: skip
    assert BOUND - 0.1 < released < BOUND + 2


async def test_a_lock_wait_through_pgbouncer_answers_503_after_the_bound(
    cluster: PrivatePostgres, api: Api
) -> None:
    direct, job = await _a_job(cluster)
    try:
        async with direct.transaction():
            await direct.fetch("SELECT 1 FROM conveyor.jobs WHERE id = $1 FOR UPDATE", job)
            started = time.monotonic()
            with pytest.raises(ServiceUnavailable) as failed:
                await api.cancel(job)
            took = time.monotonic() - started
        assert isinstance(failed.value.__cause__, asyncpg.LockNotAvailableError), failed.value
        assert (await api.cancel(job))["status"] == "CANCELLED"  # released: the same request
    finally:
        await direct.close()
    print(f"[faults] through PgBouncer: a cancel waiting for a row lock answered 503 after "
          f"{took:.2f} s (role bound {BOUND} s)")  # fmt: skip
    assert BOUND - 0.1 < took < BOUND + 1.5


async def test_changed_bounds_reach_pgbouncers_open_server_connections_after_reconnect(
    cluster: PrivatePostgres,
) -> None:
    """``ALTER ROLE … SET`` applies to new sessions: PgBouncer's open server connections keep
    the old bounds until they are replaced (``server_lifetime``, or ``RECONNECT``)."""
    role = DEFAULT_ROLES["sweeper"]
    b = PrivatePgBouncer(port=cluster.port, pool_size=1, users=[role]).start()
    owner = await asyncpg.connect(cluster.url(DATABASE))
    client = await asyncpg.connect(b.url(DATABASE, role), statement_cache_size=0)
    try:
        assert await client.fetchval("SHOW lock_timeout") == "1s"
        await owner.execute(f"ALTER ROLE {role} SET lock_timeout = '3s'")
        assert await client.fetchval("SHOW lock_timeout") == "1s"  # the same server connection
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(b.port), "-U", "postgres",
                        "pgbouncer", "-c", "RECONNECT"], check=True, capture_output=True,
                       timeout=10)  # fmt: skip
        assert await client.fetchval("SHOW lock_timeout") == "3s"
    finally:
        await owner.execute(f"ALTER ROLE {role} SET lock_timeout = '1s'")
        await client.close()
        await owner.close()
        b.stop()
