"""Shared fixtures: one migrated template database per run, a clone per test, a namespace per
test, and a running stack (API over real HTTP, publisher, sweeper, worker) on demand."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from conveyor.core.config import Settings
from conveyor.store.connect import with_database
from conveyor.store.migrate import upgrade

from . import db as tdb
from . import serial
from .clones import Clones
from .clones import drop as clones_drop
from .services import Endpoints, locate


def _run_id() -> str:
    """This process's id in every name it creates (databases ``conveyor_*_<RUN_ID>*``, broker
    namespaces ``t<RUN_ID>n<k>``): 8 hex digits of the run, then ``g`` and a two-digit process
    number. Under pytest-xdist the run part is the one shared by all the run's workers and the
    number is the worker's (gw3 -> ``g03``), so no two workers, and no two concurrent runs, ever
    share a name or a prefix; a serial run is ``g00``. Fixed length, so one process's prefix
    never matches another's names."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:8] or uuid.uuid4().hex[:8]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return f"{run}g{int(worker.removeprefix('gw')):02d}"


RUN_ID = _run_id()
_counter = itertools.count()


@pytest.fixture(scope="session")
def endpoints() -> Iterator[Endpoints]:
    try:
        found = locate()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield found
    for c in found.containers:
        with contextlib.suppress(Exception):
            c.stop()  # type: ignore[attr-defined]
    _delete_namespaced_broker_objects(f"t{RUN_ID}n")


def _delete_namespaced_broker_objects(prefix: str) -> None:
    """Remove this run's queues and exchanges from the shared broker (best effort)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None or os.environ.get("CONVEYOR_TEST_AMQP_URL"):
        return
    kinds = ("queues", "exchanges")
    try:  # both listings at once: each rabbitmqctl call starts an Erlang VM (1-3 s)
        procs = [
            subprocess.Popen(
                [ctl, "-q", f"list_{kind}", "name"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for kind in kinds
        ]
        outs = [p.communicate(timeout=30)[0] for p in procs]
    except (OSError, subprocess.TimeoutExpired):
        return
    for kind, out in zip(kinds, outs, strict=True):
        names = [n.strip() for n in out.splitlines() if n.strip().startswith(prefix)]
        if names:
            asyncio.run(_delete(kind, names))


async def _delete(kind: str, names: list[str]) -> None:
    import aio_pika

    url = os.environ.get("CONVEYOR_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    conn = await aio_pika.connect(url)
    try:
        for name in names:
            ch = await conn.channel()
            with contextlib.suppress(Exception):
                if kind == "queues":
                    await ch.queue_delete(name)
                else:
                    await ch.exchange_delete(name)
            with contextlib.suppress(Exception):
                await ch.close()
    finally:
        await conn.close()


async def _admin(endpoints: Endpoints) -> asyncpg.Connection:
    return await asyncpg.connect(endpoints.database_url, timeout=5)


@pytest.fixture(scope="session")
def template_db(endpoints: Endpoints) -> Iterator[str]:
    name = f"conveyor_tmpl_{RUN_ID}"

    async def create() -> None:
        conn = await _admin(endpoints)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    upgrade(with_database(endpoints.database_url, name))
    asyncio.run(tdb.register_test_types(with_database(endpoints.database_url, name)))
    yield name

    async def drop() -> None:
        async with asyncpg.create_pool(endpoints.database_url, min_size=0, max_size=4) as pool:
            rows = await pool.fetch(
                "SELECT datname FROM pg_database WHERE datname LIKE $1", f"conveyor_%_{RUN_ID}%"
            )
            # together: concurrent drops share the checkpoint each one waits for
            await asyncio.gather(*(clones_drop(pool, r["datname"]) for r in rows))

    asyncio.run(drop())


@pytest.fixture(scope="session")
def clones(endpoints: Endpoints, template_db: str) -> Iterator[Clones]:
    """This process's clones of the template, made ahead and dropped in the background."""
    made = Clones(endpoints.database_url, template_db, prefix=f"conveyor_t_{RUN_ID}_")
    yield made
    made.close()  # before template_db's clean-up drops the spares with the rest


@pytest.fixture
async def db_url(endpoints: Endpoints, clones: Clones) -> AsyncIterator[str]:
    """A database of the test's own: a clone of the migrated template, dropped afterwards."""
    name = await asyncio.to_thread(clones.take)
    yield with_database(endpoints.database_url, name)
    clones.give_back(name)


@pytest.fixture
def namespace() -> str:
    return f"t{RUN_ID}n{next(_counter)}"


@pytest.fixture
def settings(db_url: str, endpoints: Endpoints, namespace: str) -> Settings:
    # auth is what tests/e2e/test_security*.py test; elsewhere the API runs without keys
    return Settings(
        auth="disabled",
        database_url=db_url,
        amqp_url=endpoints.amqp_url,
        namespace=namespace,
        visibility_timeout=5,
        shutdown_grace=5,
        relay_poll_interval=0.2,
        schedule_interval=0.1,
        lease_sweep_interval=0.5,
    )


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection for raw SQL in tests (``search_path`` starts with Conveyor's schema)."""
    conn = await tdb.connect(db_url)
    yield conn
    await conn.close()


def pytest_configure(config: pytest.Config) -> None:
    serial.keep_collection_order(config)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout: waiting is not running
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under xdist, ``serial`` tests run as one block while no other test runs (tests/serial.py)."""
    serial.LOCK.before(item)
    try:
        return (yield)
    finally:
        serial.LOCK.after(item, nextitem)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # xdist groups (serial block; one worker per module with a module-scoped fixture) and order
    # (serial last, else longest first): new tests inherit them, nothing to mark by hand
    serial.arrange(config, items)
    if config.getoption("-m"):
        return
    skip = pytest.mark.skip(reason="soak: run with -m soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
