"""A component whose start fails (the broker unreachable while the database is up) is started
again by its process with backoff (``cli/lifecycle.start_with_retry``), for as long as the
outage lasts. Each failed try must give back what it opened: a worker's try had opened its
pool (holding the connection that registered its types) and its NOTIFY listener, so an hour of
broker outage left hundreds of idle sessions, enough to exhaust PostgreSQL's connections for
every other client."""

from __future__ import annotations

import asyncpg
import pytest

from conveyor.core.config import Settings
from conveyor.publisher.relay import Relay
from conveyor.worker import Worker

from .. import apps
from ..stack import free_port

TRIES = 3


async def _sessions(db: asyncpg.Connection, name: str) -> int:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = $1"
    )
    return int(await db.fetchval(query, name))


async def test_a_worker_whose_start_fails_leaves_no_session_behind(
    settings: Settings, db: asyncpg.Connection
) -> None:
    dead = settings.model_copy(update={"amqp_url": f"amqp://guest:guest@127.0.0.1:{free_port()}/"})
    for _ in range(TRIES):
        worker = Worker(dead, apps.router, concurrency=1)
        with pytest.raises(Exception, match="Connect call failed"):
            await worker.start()
    assert await _sessions(db, "conveyor-worker") == 0


async def test_a_relay_whose_start_fails_leaves_no_session_behind(
    settings: Settings, db: asyncpg.Connection
) -> None:
    dead = settings.model_copy(update={"amqp_url": f"amqp://guest:guest@127.0.0.1:{free_port()}/"})
    relays = []
    for _ in range(TRIES):
        relay = Relay(dead)
        relays.append(relay)
        with pytest.raises(Exception, match="Connect call failed"):
            await relay.start()
    assert await _sessions(db, "conveyor-publisher") == 0
    assert all(r.pool is None for r in relays)
