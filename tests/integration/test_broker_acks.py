"""Acknowledgements on a real RabbitMQ channel, open and closed (replaces a fake whose
closed-channel behaviour differed from aio-pika's: a real message raises when its channel is
closed, the fake never did)."""

from __future__ import annotations

import asyncio

import aio_pika

from conveyor.broker.acks import Acks
from conveyor.broker.consume import Delivery
from conveyor.core.config import Settings


async def _deliveries(channel: aio_pika.abc.AbstractChannel, queue: str, n: int) -> list[Delivery]:
    q = await channel.get_queue(queue)
    got: list[Delivery] = []
    done = asyncio.Event()

    async def on(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.append(Delivery.of(message))
        if len(got) == n:
            done.set()

    tag = await q.consume(on)
    await asyncio.wait_for(done.wait(), 10)
    await q.cancel(tag)
    return got


async def _depth(url: str, queue: str) -> int:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue(queue, passive=True)
        return int(q.declaration_result.message_count)
    finally:
        await conn.close()


async def test_acks_on_a_closed_channel_do_nothing_and_the_next_channel_starts_over(
    settings: Settings, namespace: str
) -> None:
    queue = f"{namespace}.acks"
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        setup = await conn.channel()
        await setup.declare_queue(queue, auto_delete=False)
        for i in range(4):
            await setup.default_exchange.publish(aio_pika.Message(str(i).encode()), queue)

        first = await conn.channel()
        await first.set_qos(prefetch_count=10)
        acks = Acks()
        old = await _deliveries(first, queue, 4)
        for d in old:
            acks.track(d)
        await first.close()  # unacked deliveries go back to the queue
        assert await acks.ack(old[:2]) >= 1  # no exception from the closed channel
        assert acks.status().held == 2

        second = await conn.channel()
        await second.set_qos(prefetch_count=10)
        new = await _deliveries(second, queue, 4)  # the same messages, tags from 1 again
        for d in new:
            acks.track(d)
        assert acks.status().held == 4  # the old channel's bookkeeping is gone
        assert await acks.ack(old[2:]) == 2  # strays: ignored by the closed channel
        assert await acks.ack(new[:3]) == 1  # one basic.ack(multiple) for tags 1-3
        assert acks.status().held == 1
        await acks.ack(new[3:])
        await second.close()
        assert await _depth(settings.amqp_url, queue) == 0  # all four acked on the new channel
        await setup.queue_delete(queue)
    finally:
        await conn.close()
