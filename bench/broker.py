"""The few RabbitMQ operations the harness needs: the server version, a queue's consumers and
depth, and deleting a run's queues and exchanges afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import aio_pika
from aio_pika.exceptions import ChannelClosed


async def server_version(url: str) -> str:
    connection = await aio_pika.connect(url, timeout=10)
    try:
        props = connection.transport.connection.server_properties  # type: ignore[union-attr]
        product = props.get("product", "RabbitMQ")
        return f"{_text(product)} {_text(props.get('version', '?'))}"
    finally:
        await connection.close()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def queue_state(url: str, queue: str) -> tuple[int, int] | None:
    """(ready messages, consumers) of ``queue``, or None when it does not exist."""
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        try:
            q = await channel.declare_queue(queue, passive=True)
        except ChannelClosed:
            return None
        result = q.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)
    finally:
        await connection.close()


async def delete(url: str, queues: Iterable[str], exchanges: Iterable[str]) -> list[str]:
    """Delete queues and exchanges (best effort); returns what was deleted."""
    deleted: list[str] = []
    connection = await aio_pika.connect(url, timeout=10)
    try:
        for kind, names in (("queue", queues), ("exchange", exchanges)):
            for name in names:
                channel = await connection.channel()
                try:
                    if kind == "queue":
                        await channel.queue_delete(name)
                    else:
                        await channel.exchange_delete(name)
                    deleted.append(name)
                except ChannelClosed:
                    continue  # did not exist; that channel is closed, take a new one
                with contextlib.suppress(Exception):
                    await channel.close()
    finally:
        await connection.close()
    return deleted
