"""``broker.frames.publish_together`` (a batch of publishes in one socket write) against a real
RabbitMQ: the same messages, properties, order, confirms and failures as aiormq's
``basic_publish``, on the same channel as it, and no hang when the channel dies under it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiormq
import pytest
from pamqp.commands import Basic

from conveyor.broker import frames, wire
from conveyor.core.config import Settings


@pytest.fixture
async def channel(settings: Settings) -> AsyncIterator[Any]:
    conn = await aiormq.connect(settings.amqp_url)
    ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
    yield ch
    await conn.close()


async def _queue(ch: Any, name: str) -> None:
    await ch.queue_declare(name, exclusive=True, arguments={"x-max-priority": 10})


async def _get_all(ch: Any, name: str) -> list[Any]:
    out: list[Any] = []
    while True:
        message = await ch.basic_get(name, no_ack=True)
        if isinstance(message.delivery, Basic.GetEmpty):
            return out
        out.append(message)


def _message(queue: str, priority: int = 5, body: bytes | None = None, **kw: Any) -> Any:
    job_id = uuid.uuid4()
    return frames.Outbound(
        kw.get("exchange", ""),
        kw.get("routing_key", queue),
        body if body is not None else wire.encode(job_id, "t"),
        wire.properties(str(job_id), priority, kw.get("traceparent")),
    )


async def test_a_batch_arrives_as_basic_publish_sends_it(channel: Any, namespace: str) -> None:
    queue = f"{namespace}.frames"
    await _queue(channel, queue)
    assert frames.one_write_possible(channel)
    big = bytes(range(256)) * 1200  # 307,200 bytes: three body frames at RabbitMQ's 128 KiB
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    batch = [
        _message(queue, 1),
        _message(queue, 9, traceparent=tp),
        _message(queue, 5, body=big),
        _message(queue, 5),
    ]
    assert await frames.publish_together(channel, batch, 10) == [None] * 4
    # the same channel goes on with basic_publish: the delivery tags stayed in step
    after = _message(queue, 0)
    confirm = await channel.basic_publish(
        after.body, routing_key=queue, properties=after.properties, mandatory=True, timeout=10
    )
    assert isinstance(confirm, Basic.Ack)
    last = _message(queue, 3)
    assert await frames.publish_together(channel, [last], 10) == [None]
    assert not channel.confirmations and not channel.message_id_delivery_tag

    got = await _get_all(channel, queue)
    order = [batch[1], batch[2], batch[3], last, batch[0], after]  # by priority, then as sent
    assert [m.header.properties.message_id for m in got] == [m.properties.message_id for m in order]
    by_id = {m.header.properties.message_id: m for m in got}
    for m in batch:
        delivered = by_id[m.properties.message_id]
        assert delivered.body == m.body
        assert delivered.header.properties.priority == m.properties.priority
        assert delivered.header.properties.delivery_mode == wire.PERSISTENT
        assert delivered.header.properties.content_type == wire.CONTENT_TYPE
    assert by_id[batch[1].properties.message_id].header.properties.headers == {"traceparent": tp}


async def test_an_unroutable_or_unencodable_message_fails_alone(
    channel: Any, namespace: str
) -> None:
    queue = f"{namespace}.frames"
    await _queue(channel, queue)
    batch = [
        _message(queue),
        _message(queue, routing_key=f"{namespace}.nowhere"),  # no queue: returned
        _message(queue, routing_key="k" * 256),  # not a shortstr
        _message(queue),
    ]
    results = await frames.publish_together(channel, batch, 10)
    assert results[0] is None and results[3] is None
    assert isinstance(results[1], aiormq.exceptions.PublishError)
    assert isinstance(results[2], frames.PublishFailed) and "255" in str(results[2])
    got = await _get_all(channel, queue)
    assert [m.header.properties.message_id for m in got] == [
        batch[0].properties.message_id,
        batch[3].properties.message_id,
    ]
    assert not channel.confirmations and not channel.message_id_delivery_tag


async def test_a_channel_that_dies_mid_batch_fails_the_rest_at_once(
    channel: Any, namespace: str
) -> None:
    """A publish to a missing exchange closes the channel (404): every message after it fails,
    none waits for the timeout, and a closed channel fails a batch before writing."""
    queue = f"{namespace}.frames"
    await _queue(channel, queue)
    batch = [_message(queue), _message(queue, exchange=f"{namespace}.missing"), _message(queue)]
    started = time.monotonic()
    results = await frames.publish_together(channel, batch, 30)
    assert time.monotonic() - started < 5
    assert all(isinstance(r, BaseException) for r in results[1:]), results
    assert channel.is_closed
    again = await frames.publish_together(channel, [_message(queue)], 30)
    assert isinstance(again[0], frames.PublishFailed) and "closed" in str(again[0])


class _Silent:
    """A channel whose broker never answers: only the confirm timeout ends the wait."""

    publisher_confirms = True
    number = 1
    max_content_size = 131072 - 8
    is_closed = False

    def __init__(self, frames_buffered: int = 0) -> None:
        self.lock = asyncio.Lock()
        self.delivery_tag = 0
        self.confirmations: dict[int, Any] = {}
        self.message_id_delivery_tag: dict[str, int] = {}
        self.write_queue: asyncio.Queue[Any] = asyncio.Queue(frames_buffered)

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()


async def test_no_confirm_within_the_timeout_fails_every_message() -> None:
    """Each message fails as unconfirmed, its confirm still registered: a broker that blocked
    the connection may confirm it later (``acked`` then says so), and its bookkeeping goes once
    the confirm settles."""
    ch = _Silent()
    results = await frames.publish_together(ch, [_message("q"), _message("q")], 0.2)
    assert [str(r) for r in results] == ["no confirm within 0.2 s"] * 2
    assert all(isinstance(r, frames.Unconfirmed) for r in results)
    assert ch.write_queue.qsize() == 1  # one write for the batch
    assert ch.delivery_tag == 2 and len(ch.message_id_delivery_tag) == 2
    ch.confirmations[1].set_result(Basic.Ack(delivery_tag=1))
    ch.confirmations[2].set_exception(frames.PublishFailed("channel closed"))
    await asyncio.sleep(0)  # the futures' done callbacks
    late = [r.confirm for r in results if isinstance(r, frames.Unconfirmed)]
    assert [frames.acked(c) for c in late] == [True, False]
    assert not ch.message_id_delivery_tag


async def test_a_batch_cancelled_before_its_write_leaves_the_channel_as_it_was() -> None:
    ch = _Silent(frames_buffered=1)
    ch.write_queue.put_nowait(b"a frame the writer has not taken")  # the writer is stuck
    task = asyncio.create_task(frames.publish_together(ch, [_message("q"), _message("q")], 5))
    await asyncio.sleep(0.05)
    assert ch.delivery_tag == 2  # tags taken, waiting to write
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert ch.delivery_tag == 0 and not ch.confirmations and not ch.message_id_delivery_tag
