"""The duties every ``conveyor api`` and ``conveyor worker`` runs (``cli/duties.py``), held by one
process at a time: a fleet of processes relays through one relay and runs one sweeper, not one
per process (each polling the database every fraction of a second, on connections of its own).
The holder that stops or loses its session is replaced within a few turns; a holder that cannot
run them (a broker it cannot reach) gives them up to another process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import asyncpg
import pytest

from conveyor import JobSpec, enqueue_many
from conveyor.cli.duties import Duties
from conveyor.core.config import Settings

STALE_AFTER = 1.5  # the outbox watch's threshold: the duties turn every third of it (0.5 s)


class Fleet:
    """Duties as N processes would run them, in the test's loop."""

    def __init__(self) -> None:
        self.members: list[Duties] = []
        self.stops: list[asyncio.Event] = []
        self.tasks: list[asyncio.Task[None]] = []

    def add(self, settings: Settings, **kw: float) -> Duties:
        duties = Duties(settings.model_copy(update={"outbox_stale_after": STALE_AFTER}), **kw)
        self.members.append(duties)
        self.stops.append(asyncio.Event())
        self.tasks.append(asyncio.create_task(duties.run(self.stops[-1])))
        return duties

    async def stop(self, duties: Duties) -> None:
        i = self.members.index(duties)
        self.stops[i].set()
        await asyncio.wait_for(self.tasks[i], 30)

    def states(self) -> list[str]:
        return [d.details().get("state", "") for d in self.members]

    def holders(self) -> list[Duties]:
        live = [d for d, s in zip(self.members, self.stops, strict=True) if not s.is_set()]
        return [d for d in live if d.details().get("state") == "holder"]


@asynccontextmanager
async def fleet() -> AsyncIterator[Fleet]:
    f = Fleet()
    try:
        yield f
    finally:
        for stop in f.stops:
            stop.set()
        await asyncio.wait_for(asyncio.gather(*f.tasks, return_exceptions=True), 30)


async def until(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        await asyncio.sleep(0.05)


async def relays(db: asyncpg.Connection) -> int:
    """Relays connected to the test's database (each LISTENs on one connection of its own)."""
    return int(
        await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'conveyor-publisher-listen'"
        )
    )


async def relayed(db: asyncpg.Connection, timeout: float = 30) -> None:
    """A job enqueued now leaves the outbox (a relay published it) within ``timeout``."""
    [job_id] = await enqueue_many(db, [JobSpec("t")])
    deadline = time.monotonic() + timeout
    while await db.fetchval("SELECT count(*) FROM job_outbox WHERE job_id = $1", job_id):
        assert time.monotonic() < deadline, f"job {job_id} not relayed in {timeout} s"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(120)
async def test_one_process_at_a_time_holds_the_duties(
    settings: Settings, db: asyncpg.Connection
) -> None:
    async with fleet() as f:
        for _ in range(3):
            f.add(settings)
        await relayed(db)
        await asyncio.sleep(3)  # six turns of each: still one holder
        assert await relays(db) == 1, f.states()
        assert sorted(f.states()) == ["holder", "standby", "standby"]
        [holder] = f.holders()
        assert "relay" in holder.details() and "maintenance" in holder.details()
        assert all("relay" not in d.details() for d in f.members if d is not holder)

        await f.stop(holder)  # it stops (a deploy, a scale-down): another one takes over
        await until(lambda: len(f.holders()) == 1, "new holder", timeout=20)
        await relayed(db)
        assert await relays(db) == 1


@pytest.mark.timeout(120)
async def test_a_holder_that_lost_its_session_stops_its_duties(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """Its session ended (PostgreSQL restarted it, a partition, ``idle_session_timeout`` after
    a freeze): the lock went with it, some process takes the duties, and never two relay for
    long."""
    async with fleet() as f:
        for _ in range(2):
            f.add(settings)
        await until(lambda: len(f.holders()) == 1, "holder")
        await relayed(db)
        ended = await db.fetchval(
            "SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a "
            "JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' "
            "WHERE a.datname = current_database() AND a.application_name = 'conveyor-duties'"
        )
        assert ended == 1
        await asyncio.sleep(2)
        await until(lambda: len(f.holders()) == 1, "holder again")
        await relayed(db)
        deadline = time.monotonic() + 20
        while await relays(db) != 1:
            assert time.monotonic() < deadline, f.states()
            await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
async def test_a_holder_that_cannot_run_them_gives_them_up(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """The first process to win cannot reach the broker (a wrong URL, a partition): after
    ``give_up`` seconds it lets another process hold the duties, and jobs flow."""
    unreachable = settings.model_copy(update={"amqp_url": "amqp://guest:guest@127.0.0.1:1/"})
    async with fleet() as f:
        broken = f.add(unreachable, give_up=2.0)
        await until(lambda: f.holders() == [broken], "the broken process holding")
        good = f.add(settings, give_up=2.0)
        await relayed(db, timeout=60)
        assert f.holders() == [good]
        assert broken.details()["state"] == "standby"
        assert "Connect" in (broken.details()["error"] or ""), broken.details()


@pytest.mark.timeout(120)
async def test_without_a_session_of_their_own_every_process_runs_them(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """Behind a transaction pooler without CONVEYOR_LISTEN_DATABASE_URL a session lock means
    nothing (the next statement may run on another server session): no election, each process
    runs the duties, which are safe side by side."""
    pooled = settings.model_copy(update={"db_pooler": "transaction"})
    async with fleet() as f:
        members = [f.add(pooled), f.add(pooled)]
        await until(lambda: len(f.holders()) == 2, "both running the duties")
        assert all(d.details()["election"] is False for d in members)
        await relayed(db)
        with_listen = Duties(pooled.model_copy(update={"listen_database_url": pooled.database_url}))
        assert with_listen.elects  # a direct session for LISTEN holds the lock as well
