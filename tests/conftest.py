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
from typing import Any

import asyncpg
import pytest

from conveyor.core.config import Settings
from conveyor.store.connect import with_database
from conveyor.store.migrate import upgrade

from . import db as tdb
from .services import Endpoints, locate

RUN_ID = uuid.uuid4().hex[:8]
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
    _delete_namespaced_broker_objects(f"t{RUN_ID}")


def _delete_namespaced_broker_objects(prefix: str) -> None:
    """Remove this run's queues and exchanges from the shared broker (best effort)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None or os.environ.get("CONVEYOR_TEST_AMQP_URL"):
        return
    for kind in ("queues", "exchanges"):
        try:
            out = subprocess.run(
                [ctl, "-q", f"list_{kind}", "name"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return
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
        conn = await _admin(endpoints)
        try:
            rows = await conn.fetch(
                "SELECT datname FROM pg_database WHERE datname LIKE $1", f"conveyor_%_{RUN_ID}%"
            )
            for r in rows:
                await conn.execute(f'DROP DATABASE IF EXISTS "{r["datname"]}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture
async def db_url(endpoints: Endpoints, template_db: str) -> AsyncIterator[str]:
    name = f"conveyor_t_{RUN_ID}_{next(_counter)}"
    conn = await _admin(endpoints)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    finally:
        await conn.close()
    yield with_database(endpoints.database_url, name)
    conn = await _admin(endpoints)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


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


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if config.getoption("-m"):
        return
    skip = pytest.mark.skip(reason="soak: run with -m soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
