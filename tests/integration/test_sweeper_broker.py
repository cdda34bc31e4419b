"""The sweeper's broker use and its health: a queue depth that cannot be read is
not 0, and liveness says when a duty stopped completing passes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import asyncpg
import pytest

from conveyor import JobSpec, enqueue_many
from conveyor.broker import wire
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper


@pytest.fixture
async def sweeper(settings: Settings) -> AsyncIterator[Sweeper]:
    s = Sweeper(settings.model_copy(update={"reconcile_after": 30}))
    await s.start()
    yield s
    await s.close()


async def test_a_depth_that_cannot_be_read_skips_the_type(
    settings: Settings, db: asyncpg.Connection, sweeper: Sweeper, caplog: pytest.LogCaptureFixture
) -> None:
    """Four jobs sit in their queue, which another connection holds exclusively: reading its
    depth fails with RESOURCE_LOCKED. Counting that as depth 0 re-published all four; the
    reconciler must skip the type this pass, with a log line and a metric."""
    ids = await enqueue_many(db, [JobSpec("held") for _ in range(4)])
    t = Topology(settings.namespace)
    owner = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await owner.channel()
        await t.declare_base(ch)
        queue = await ch.declare_queue(
            t.work_queue("held"), exclusive=True, arguments=t.work_queue_arguments()
        )
        for job_id in ids:  # what the relay would have sent (it cannot declare the queue either)
            body = wire.encode(job_id, "held")
            await ch.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name)
        await db.execute("DELETE FROM job_outbox")
        await db.execute("UPDATE jobs SET updated_at = now() - interval '31 s'")
        # two passes: one alone never re-publishes (the first only marks suspects)
        assert [await sweeper.reconcile() for _ in range(2)] == [0, 0]
    finally:
        await owner.close()
    assert sweeper.metrics.queue_depth_failed.labels("held")._value.get() == 2  # one per pass
    lines = [r for r in caplog.records if r.getMessage() == "queue_depth_failed"]
    assert len(lines) == 2
    line = lines[0]
    assert line.fields["type"] == "held" and "RESOURCE_LOCKED" in line.fields["error"]  # type: ignore[attr-defined]


async def test_a_missing_queue_is_depth_zero(
    settings: Settings, db: asyncpg.Connection, sweeper: Sweeper
) -> None:
    """The queue is gone (deleted with its messages): its overdue jobs are re-published."""
    await enqueue_many(db, [JobSpec("vanished") for _ in range(2)])
    await db.execute("DELETE FROM job_outbox")
    await db.execute("UPDATE jobs SET updated_at = now() - interval '31 s'")
    assert await sweeper.reconcile() == 0  # the first pass marks them as suspects
    assert await sweeper.reconcile() == 2
    assert sweeper.metrics.queue_depth_failed.labels("vanished")._value.get() == 0


async def test_liveness_turns_false_when_a_duty_stops_passing(settings: Settings) -> None:
    """Each duty must complete a pass within its interval plus ``maintenance_deadline``
    (injected clock: no sleeping)."""
    now = [100.0]
    s = Sweeper(settings.model_copy(update={"maintenance_deadline": 5.0}), clock=lambda: now[0])
    await s.start()
    try:
        assert s.live()[0]
        now[0] += settings.schedule_interval + 5.1  # no pass of any duty since the start
        ok, details = s.live()
        assert not ok and details["promote"]["seconds_since_pass"] > 5
        stop = asyncio.Event()
        task = asyncio.create_task(s.run(stop))
        try:
            while not s.live()[0]:  # one pass of each duty brings it back
                await asyncio.sleep(0.01)
        finally:
            stop.set()
            await task
    finally:
        await s.close()
