"""Priorities in both queue types: with a backlog of low-priority jobs, a high-priority job starts
within a few jobs' time. Classic queues carry message priorities (``x-max-priority``); RabbitMQ
3.10's quorum queues have none, so quorum mode keeps two bands per type (``<ns>.high.<type>``
consumed with its own prefetch window, the worker's inbox handing out high deliveries first).
Two shapes: the backlog is in the queue before the worker starts, and the high job arrives while
the worker is busy working through the backlog. Then a high-priority retry comes back to its
band through a holding pen (quorum), and the reconciler's depth counts both bands."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from conveyor.broker.inspect import Inspector
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings

from .. import apps
from ..stack import running_stack, wait_for


@pytest.mark.parametrize("queue_type", ["quorum"])  # classic: test_lifecycle.py
async def test_high_overtakes_a_queued_backlog(
    settings: Settings, db_url: str, queue_type: str
) -> None:
    s = settings.model_copy(update={"queue_type": queue_type})
    apps.reset()
    async with running_stack(s, None) as stack:
        r = await stack.client.post(
            "/jobs/batch", json={"jobs": [{"type": "noop", "priority": "low"}] * 120}
        )
        low = [j["id"] for j in r.json()["jobs"]]
        high = await stack.submit("noop", priority="high")
        for _ in range(100):  # everything published before a worker starts
            if not await stack.relay.run_once():
                break
        await stack.add_worker(apps.router, concurrency=4)
        await wait_for(db_url, [*low, high], timeout=30)
        assert apps.ORDER.index(high) < 10, apps.ORDER.index(high)


# classic priority queues pass this too (it ran in both modes while it was written);
# kept to quorum in the default run for time
@pytest.mark.parametrize("queue_type", ["quorum"])
async def test_high_overtakes_while_the_worker_is_busy(
    settings: Settings, db_url: str, queue_type: str
) -> None:
    s = settings.model_copy(update={"queue_type": queue_type})
    apps.reset()
    async with running_stack(s, apps.router, concurrency=4) as stack:
        r = await stack.client.post(
            "/jobs/batch",
            json={"jobs": [{"type": "slow", "priority": "low", "payload": {"seconds": 0.1}}] * 80},
        )
        low = [j["id"] for j in r.json()["jobs"]]
        while len(apps.ORDER) < 8:  # the worker is busy with the backlog
            await asyncio.sleep(0.02)
        high = await stack.submit("slow", {"seconds": 0.1}, priority="high")
        await wait_for(db_url, [*low, high], timeout=60)
        # 4 slots and a prefetch of 4: at most the 4 running + 4 already in hand start first
        position = apps.ORDER.index(high)
        started_after = position - apps.ORDER.index(low[7])
        assert started_after <= 9, (position, started_after)
        if queue_type == "quorum":
            t = Topology(s.namespace, "quorum")
            conn = await aio_pika.connect(s.amqp_url)
            try:
                ch = await conn.channel()
                for name in t.work_queues("slow"):
                    q = await ch.declare_queue(name, passive=True)
                    assert q.declaration_result.message_count == 0
                    # a quorum queue: redeclaring it as classic is refused
                with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
                    await ch.declare_queue(t.high_queue("slow"), durable=True)
            finally:
                await conn.close()


async def test_a_high_retry_comes_back_to_its_band(settings: Settings, db_url: str) -> None:
    s = settings.model_copy(update={"queue_type": "quorum"})
    apps.reset()
    async with running_stack(s, apps.router, concurrency=4) as stack:
        job = await stack.submit("flaky", {"succeed_on": 2}, priority="high")
        await wait_for(db_url, [job], statuses=["COMPLETED"], timeout=30)
        assert apps.RUNS[job] == 2
    # the reconciler's depth of a type sums its bands
    t = Topology(s.namespace, "quorum")
    inspector = Inspector(s.amqp_url, t, name="test")
    conn = await aio_pika.connect(s.amqp_url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await t.declare_base(ch)
        await t.declare_work_queues(ch, "idle")
        exchange = await ch.get_exchange(t.exchange)
        for key in (t.routing_key("idle", 9), t.routing_key("idle", 5), "idle"):
            await exchange.publish(aio_pika.Message(b"x"), routing_key=key)
        assert await inspector.queue_depth("idle") == 3
        high = await ch.declare_queue(t.high_queue("idle"), passive=True)
        assert high.declaration_result.message_count == 1
    finally:
        await inspector.close()
        await conn.close()
