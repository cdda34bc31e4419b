"""Fault-suite fixtures: private RabbitMQ nodes and PostgreSQL clusters to break (one per module
that asks, started lazily), an audited database per test, a handler ledger per test, and fast
settings. The shared services on 5672/5432 are only ever used normally."""

from __future__ import annotations

import asyncio
import itertools
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from conveyor.core.config import Settings
from conveyor.store.connect import ensure_database
from conveyor.store.migrate import upgrade

from .. import db as tdb
from .checker import VERDICTS, Ledger, install_audit
from .harness import LIVE, fault_settings
from .infra import PrivatePostgres, PrivateRabbit

_counter = itertools.count()


# --------------------------------------------------------------------------- private RabbitMQ


@pytest.fixture(scope="module")
def private_rabbit() -> Iterator[PrivateRabbit]:
    node = PrivateRabbit()
    try:
        node.start()
        yield node
    finally:
        node.stop()


@pytest.fixture
def rabbit(private_rabbit: PrivateRabbit) -> PrivateRabbit:
    """The module's private node, running (a previous test may have left it stopped)."""
    private_rabbit.ensure_running()
    return private_rabbit


# --------------------------------------------------------------------------- private PostgreSQL


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    cluster = PrivatePostgres()
    try:
        cluster.start()
        template = cluster.url("conveyor_faults_template")
        asyncio.run(ensure_database(template))
        upgrade(template)
        asyncio.run(tdb.register_test_types(template))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def private_db_url(private_pg: PrivatePostgres) -> AsyncIterator[str]:
    """A migrated, audited database of its own on the private cluster."""
    if not private_pg.running:
        private_pg.start()
    name = f"faults_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    conn = await asyncpg.connect(private_pg.url(), timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE conveyor_faults_template')
    finally:
        await conn.close()
    url = private_pg.url(name)
    await install_audit(url)
    yield url


# --------------------------------------------------------------------------- per-test state


@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    """SIGKILL the subprocesses a test started and left running (a failed assertion skips the
    test's own ``stop()``)."""
    yield
    while LIVE:
        proc = LIVE.pop()
        if proc.alive():
            proc.signal(signal.SIGKILL)
            assert proc.popen is not None
            proc.popen.wait(10)


@pytest.fixture
async def audited_db_url(db_url: str) -> str:
    """The shared server's per-test clone (root conftest), with the checker's audit trigger."""
    await install_audit(db_url)
    return db_url


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.txt")


@pytest.fixture
def fsettings(settings: Settings, audited_db_url: str) -> Settings:
    """Shared PostgreSQL (audited clone) and RabbitMQ (own namespace), fast clocks."""
    return fault_settings(settings, database_url=audited_db_url)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not VERDICTS:
        return
    terminalreporter.section("fault checker figures")
    for v in VERDICTS:
        terminalreporter.write_line(v.summary())
