"""Reading and staging broker state for tests: pen depths, pens declared ahead, and waiting on a
metric instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import aio_pika
from aio_pika.exceptions import ChannelClosed

from conveyor.broker.topology import Topology
from conveyor.core.config import Settings
from conveyor.core.jobs import pen_name_suffix
from conveyor.publisher.relay import Relay


def published(relay: Relay, destination: str) -> float:
    """The relay's ``conveyor_outbox_published{destination=...}`` counter."""
    return relay.metrics.outbox_published.labels(destination)._value.get()


async def wait_metric(predicate: Callable[[], bool], *, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def declare_pens(settings: Settings, delays: Iterable[int]) -> None:
    """The pens as the current code declares them (earlier retries of other delays)."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await conn.channel()
        t = Topology(settings.namespace)
        await t.declare_base(ch)
        for d in delays:
            await t.declare_pen(ch, d)
    finally:
        await conn.close()


async def queue_depth(settings: Settings, name: str) -> int:
    """Ready messages in ``name`` (passive declare); -1 when it does not exist."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await conn.channel()
        try:
            q = await ch.declare_queue(name, passive=True)
        except ChannelClosed:
            return -1
        return int(q.declaration_result.message_count or 0)
    finally:
        await conn.close()


async def pen_depths(settings: Settings, delays: Iterable[int]) -> dict[int, int]:
    ns = settings.namespace
    return {d: await queue_depth(settings, f"{ns}.retry.{pen_name_suffix(d)}") for d in delays}
