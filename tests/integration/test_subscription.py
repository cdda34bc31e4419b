"""The worker's subscription on a real RabbitMQ: after a consumer's first delivery, deliveries
skip aio-pika's message wrapper (``Subscription._swap``), arrive with the same fields, and settle
(ack, reject, nack) on the channel they came on; after the channel is restored by aio-pika, the
consumer's deliveries keep flowing and take the direct path again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest

from conveyor.broker import wire
from conveyor.broker.consume import Delivery, Subscription
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings


@pytest.fixture
async def sub(settings: Settings) -> AsyncIterator[Subscription]:
    s = Subscription(settings.amqp_url, settings.namespace, name="test-sub", prefetch=10)
    await s.open(["t"])
    yield s
    await s.close()


async def _publish(url: str, queue: str, n: int, priority: int = 5) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(n)]
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        for i in ids:
            await ch.default_exchange.publish(
                aio_pika.Message(
                    wire.encode(uuid.UUID(i), "t"), message_id=i, priority=priority,
                    headers={"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"},
                ),
                queue,
            )  # fmt: skip
    finally:
        await conn.close()
    return ids


async def _depth(url: str, queue: str) -> int:
    conn = await aio_pika.connect(url)
    try:
        q = await (await conn.channel()).declare_queue(queue, passive=True)
        return int(q.declaration_result.message_count or 0)
    finally:
        await conn.close()


class _Inbox:
    def __init__(self) -> None:
        self.got: list[Delivery] = []
        self.arrived = asyncio.Event()

    async def __call__(self, d: Delivery) -> None:
        self.got.append(d)
        self.arrived.set()

    async def wait_for(self, n: int) -> list[Delivery]:
        async with asyncio.timeout(10):
            while len(self.got) < n:
                self.arrived.clear()
                await self.arrived.wait()
        return self.got[:n]


async def test_deliveries_after_the_first_take_the_direct_path_and_settle(
    sub: Subscription, settings: Settings
) -> None:
    t = Topology(settings.namespace)
    queue = t.work_queue("t")
    inbox = _Inbox()
    await sub.consume(inbox)
    ids = await _publish(settings.amqp_url, queue, 5, priority=7)
    got = await inbox.wait_for(5)

    assert sub.channel is not None
    underlay: Any = await sub.channel.get_underlay_channel()
    (tag,) = sub.consumer_tags.values()
    assert underlay.consumers[tag] == sub._raw  # swapped in by the first delivery
    assert [d.message_id for d in got] == ids
    for d in got:
        assert wire.decode(d.body).job_id == uuid.UUID(d.message_id or "")
        assert (d.routing_key, d.priority, d.channel) == (queue, 7, underlay)
        assert d.traceparent == f"00-{'1' * 32}-{'2' * 16}-01"

    await got[1].ack(multiple=True)  # the first two
    await got[2].reject(requeue=False)  # to the dead-letter queue
    await got[3].nack(requeue=True)  # back to the queue: delivered again
    await got[4].ack()
    again = (await inbox.wait_for(6))[5]
    assert again.message_id == ids[3] and again.delivery_tag != got[3].delivery_tag
    await again.ack()
    await asyncio.sleep(0.2)
    assert await _depth(settings.amqp_url, queue) == 0
    assert await _depth(settings.amqp_url, t.dead_letter_queue) == 1


async def test_a_restored_channel_keeps_delivering_and_swaps_again(
    sub: Subscription, settings: Settings
) -> None:
    queue = Topology(settings.namespace).work_queue("t")
    inbox = _Inbox()
    await sub.consume(inbox)
    await _publish(settings.amqp_url, queue, 2)
    first = await inbox.wait_for(2)
    for d in first:
        await d.ack()
    assert sub.channel is not None
    old: Any = await sub.channel.get_underlay_channel()
    await old.basic_ack(10_000)  # an unknown tag: the broker closes the channel (406)
    new: Any = old
    async with asyncio.timeout(10):
        while new is old or new.is_closed:  # aio-pika reopens it and restores the consumer
            await asyncio.sleep(0.05)
            new = await sub.channel.get_underlay_channel()

    ids = await _publish(settings.amqp_url, queue, 3)
    got = (await inbox.wait_for(5))[2:]
    assert [d.message_id for d in got] == ids
    assert all(d.channel is new for d in got)
    (tag,) = sub.consumer_tags.values()
    assert new.consumers[tag] == sub._raw
    for d in got:
        await d.ack()
    await asyncio.sleep(0.2)
    assert await _depth(settings.amqp_url, queue) == 0


@pytest.mark.parametrize(
    ("heartbeat", "query", "agreed"), [(4, "", 4), (0, "", 0), (4, "?heartbeat=9", 9)]
)
async def test_the_connection_tunes_the_heartbeat_it_asks_for(
    settings: Settings, heartbeat: int, query: str, agreed: int
) -> None:
    """The heartbeat the broker suggests (60 s by default) gives way to the one asked for in
    the connection's Tune-Ok, and that to one written in the URL."""
    url = settings.amqp_url.rstrip("/") + "/" + query
    s = Subscription(url, settings.namespace, name="hb", prefetch=1, heartbeat=heartbeat)
    await s.open(["t"])
    try:
        assert s.connection is not None and s.connection.transport is not None
        assert s.connection.transport.connection.connection_tune.heartbeat == agreed
    finally:
        await s.close()
