"""A batch of publishes as ONE socket write, with aiormq's confirm bookkeeping.

aiormq's ``basic_publish`` takes the channel's lock, opens a timeout scope, marshals three frames
and hands them to the connection's writer, once per message: for the relay's batch of 500 that
was 500 ``send`` calls, and 500 TCP segments for RabbitMQ to read, each a wake-up of its
reader (a quarter of the publisher's CPU in the batch benchmark went to ``StreamWriter.write``).
``publish_together`` marshals the same frames for the whole batch, numbers them with the
channel's delivery tags and registers their confirms exactly as ``basic_publish`` does (so
aiormq's reader settles them: ack, nack, return, closed channel), and writes them at once.

It uses aiormq's channel attributes (``one_write_possible`` checks them on every batch; a
version without them falls back to ``basic_publish``); ``tests/integration/test_publish_frames.py``
holds it to the same outcomes as ``basic_publish``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from aiormq.abc import ChannelFrame
from pamqp import frame as amqp_frame
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

MAX_ROUTING_KEY_BYTES = 255  # AMQP shortstr


class PublishFailed(Exception):
    """The broker did not confirm a message (nack, return, timeout, closed channel)."""


class Unconfirmed(PublishFailed):
    """No confirm within the wait, but the message may still be routed: a broker under a
    resource alarm holds what was written until the alarm clears. ``confirm`` stays registered
    with the channel and settles when the broker answers at last, or the channel closes."""

    def __init__(self, timeout: float, confirm: asyncio.Future[Any]) -> None:
        super().__init__(f"no confirm within {timeout} s")
        self.confirm = confirm


def acked(confirm: asyncio.Future[Any]) -> bool:
    """Whether a settled confirm says the broker took the message."""
    done = confirm.done() and not confirm.cancelled() and confirm.exception() is None
    return done and isinstance(confirm.result(), Basic.Ack)


class Outbound(NamedTuple):
    exchange: str
    routing_key: str
    body: bytes
    properties: Basic.Properties  # its ``message_id`` names the message in a return


_NEEDS = (
    "lock",
    "delivery_tag",
    "confirmations",
    "message_id_delivery_tag",
    "write_queue",
    "create_future",
    "number",
    "max_content_size",
    "is_closed",
)


def one_write_possible(channel: Any) -> bool:
    """Whether ``channel`` is an aiormq channel with confirms and the attributes used here."""
    return bool(getattr(channel, "publisher_confirms", False)) and all(
        hasattr(channel, name) for name in _NEEDS
    )


async def publish_together(
    channel: Any, messages: Sequence[Outbound], timeout: float
) -> list[BaseException | None]:
    """Publish ``messages`` (``mandatory``) in one write and wait up to ``timeout`` seconds for
    their confirms; per message None (confirmed) or the error, never raised."""
    results: list[BaseException | None] = [None] * len(messages)
    try:
        waiting = await _write(channel, messages, results)
    except Exception as exc:  # the channel closed before the write (aiormq's lock says so)
        return [PublishFailed(f"not sent: {exc}"[:200])] * len(messages)
    if not waiting:
        return results
    await asyncio.wait([confirm for _, confirm in waiting], timeout=timeout)
    for i, confirm in waiting:
        if not confirm.done():
            results[i] = Unconfirmed(timeout, confirm)
        elif (error := confirm.exception()) is not None:  # nack, return, closed channel
            results[i] = error
        elif not isinstance(confirm.result(), Basic.Ack):
            results[i] = PublishFailed(f"not confirmed: {confirm.result()!r}"[:200])
    return results


async def _write(
    channel: Any, messages: Sequence[Outbound], results: list[BaseException | None]
) -> list[tuple[int, asyncio.Future[Any]]]:
    """Register a confirm per message and write them all; the (index, confirm) pairs written.
    A message that cannot be encoded gets its error in ``results``. If the write does not
    happen (closed channel, cancellation), the channel's bookkeeping is as before."""
    waiting: list[tuple[int, asyncio.Future[Any]]] = []
    parts: list[bytes] = []
    async with channel.lock:  # tags number the frames in the order the channel sends them
        first_tag = channel.delivery_tag
        try:
            for i, message in enumerate(messages):
                try:
                    data = _marshal(channel, message)
                except Exception as exc:  # a frame pamqp refuses fails its own message only
                    results[i] = PublishFailed(f"cannot encode: {exc}"[:200])
                    continue
                channel.delivery_tag += 1
                tag = channel.delivery_tag
                confirm = channel.create_future()  # rejected by aiormq when the channel closes
                channel.confirmations[tag] = confirm
                message_id: str = message.properties.message_id or ""  # _marshal refused none
                channel.message_id_delivery_tag[message_id] = tag  # how a return finds it
                confirm.add_done_callback(_forget(channel, message_id, tag))
                parts.append(data)
                waiting.append((i, confirm))
            if parts:
                await channel.write_queue.put(ChannelFrame(b"".join(parts), should_close=False))
        except BaseException:  # not written: the broker never saw these tags
            channel.delivery_tag = first_tag
            for _, confirm in waiting:
                confirm.cancel()
            for tag in range(first_tag + 1, first_tag + len(waiting) + 1):
                channel.confirmations.pop(tag, None)
            raise
    return waiting


def _marshal(channel: Any, message: Outbound) -> bytes:
    """One message's method, header and body frames on ``channel``, as bytes."""
    if not message.properties.message_id:
        raise ValueError("a message without message_id")
    if len(message.routing_key.encode()) > MAX_ROUTING_KEY_BYTES:
        raise ValueError("routing key over 255 bytes")
    body, number, step = message.body, channel.number, channel.max_content_size
    out = [
        amqp_frame.marshal(
            Basic.Publish(
                exchange=message.exchange, routing_key=message.routing_key, mandatory=True
            ),
            number,
        ),
        amqp_frame.marshal(
            ContentHeader(body_size=len(body), properties=message.properties), number
        ),
    ]
    out.extend(
        amqp_frame.marshal(ContentBody(body[start : start + step]), number)
        for start in range(0, len(body), step)
    )
    return b"".join(out)


def _forget(channel: Any, message_id: str, tag: int) -> Callable[[Any], None]:
    """aiormq's clean-up of a settled confirm: the message id stops naming the tag. Its error is
    retrieved: a late confirm nobody awaits any more may fail (the channel closed)."""

    def forget(confirm: asyncio.Future[Any]) -> None:
        if not confirm.cancelled():
            confirm.exception()
        if channel.message_id_delivery_tag.get(message_id) == tag:
            channel.message_id_delivery_tag.pop(message_id, None)

    return forget
