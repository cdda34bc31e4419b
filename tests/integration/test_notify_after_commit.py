"""The NOTIFY that wakes the relay is sent after the commit that wrote the outbox rows, never
inside the transaction: ``pg_notify`` takes a database-wide lock held until the commit is
flushed, so a NOTIFY inside a transaction serialises every other notifying commit (see
``store/notify.py``).

Checked for the worker's completer (retries, dead letters, hand-backs) and the sweeper
(promotions, lease recoveries, re-publishes): no recorded call is made in a transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import pytest

from conveyor import Job, JobRouter, JobSpec, enqueue_many
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import for_schema

from ..stack import running_stack, wait_for

router = JobRouter()


@router.job("doomed", max_retries=1, retry_delays=[1])
async def doomed(job: Job) -> None:
    raise ValueError("no")


@pytest.fixture
def notified(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Each NOTIFY sent: whether its connection was inside a transaction."""
    store_type = type(for_schema(settings.db_schema))
    original = store_type.outbox_notify
    calls: list[bool] = []

    async def spy(self: object, conn: asyncpg.Connection) -> None:
        calls.append(conn.is_in_transaction())
        await original(self, conn)  # type: ignore[arg-type]

    monkeypatch.setattr(store_type, "outbox_notify", spy)
    yield calls


async def _some(calls: list[bool], n: int) -> None:
    for _ in range(100):
        if len(calls) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(calls)} notifications, expected {n}")


async def test_the_sweeper_notifies_after_its_commits(
    settings: Settings, db: asyncpg.Connection, notified: list[bool]
) -> None:
    sweeper = Sweeper(settings)
    await sweeper.start()
    try:
        due, leased = await enqueue_many(db, [JobSpec("t", delay_seconds=60), JobSpec("t")])
        await db.execute("DELETE FROM job_outbox")
        await db.execute("UPDATE jobs SET run_at = now() - interval '1 ms' WHERE id = $1", due)
        await db.execute(
            "UPDATE jobs SET status = 'IN_PROGRESS', attempts = 1, max_retries = 3,"
            " lease_expires_at = now() - interval '1 s' WHERE id = $1",
            leased,
        )
        assert await sweeper.promote_due() == 1
        await _some(notified, 1)
        assert await sweeper.recover_leases() == {"RETRYING": 1}
        await _some(notified, 2)
    finally:
        await sweeper.close()
    assert notified and not any(notified), notified


async def test_the_completer_notifies_after_its_commits(
    settings: Settings, db_url: str, notified: list[bool]
) -> None:
    async with running_stack(settings, router) as stack:
        job_id = await stack.submit("doomed")
        await wait_for(db_url, [job_id], statuses=["FAILED"], timeout=20)
        await _some(notified, 2)  # the retry's outbox row, then the dead letter's
    assert not any(notified), notified
