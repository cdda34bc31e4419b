"""The consumer side of RabbitMQ for the worker: one channel, its work queues, and deliveries.

``Delivery`` is what the worker sees of a message: its body, its delivery tag, the channel it
came on (captured at arrival, so bookkeeping never asks a closed channel), and the three ways to
settle it. Settling a delivery whose channel has closed does nothing (the broker requeues every
unsettled delivery of a closed channel by itself) and never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from ..core.jobs import DEFAULT_PRIORITY
from .topology import Topology, connect
from .wire import MalformedMessage, decode

__all__ = ["Delivery", "Inbox", "MalformedMessage", "Subscription", "job_id_of"]


def job_id_of(body: bytes) -> uuid.UUID:
    """The job a message body names (``MalformedMessage`` when it names none)."""
    return decode(body).job_id


@dataclass(eq=False, slots=True)
class Delivery:
    body: bytes
    routing_key: str | None
    message_id: str | None
    delivery_tag: int | None
    channel: object  # the AMQP channel it arrived on: tags are numbered per channel
    _message: AbstractIncomingMessage | None = field(default=None, repr=False)
    priority: int = DEFAULT_PRIORITY

    @classmethod
    def of(cls, message: AbstractIncomingMessage) -> Delivery:
        return cls(
            message.body,
            message.routing_key,
            message.message_id,
            message.delivery_tag,
            message.channel,
            message,
            DEFAULT_PRIORITY if message.priority is None else message.priority,
        )

    async def ack(self, multiple: bool = False) -> None:
        if self._message is not None:
            with contextlib.suppress(Exception):  # a closed channel: the broker requeues it
                await self._message.ack(multiple=multiple)

    async def reject(self, requeue: bool = False) -> None:
        """To the dead-letter queue (``requeue=False``)."""
        if self._message is not None:
            with contextlib.suppress(Exception):
                await self._message.reject(requeue=requeue)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        """Back to its queue, for another consumer."""
        if self._message is not None:
            with contextlib.suppress(Exception):
                await self._message.nack(multiple=multiple, requeue=requeue)


OnDelivery = Callable[[Delivery], Awaitable[None]]


class Inbox(asyncio.Queue[Delivery]):
    """The worker's deliveries in hand, waiting for a slot: the highest priority first, in
    arrival order within a priority. With quorum queues (no broker-side priorities) this is
    what lets a high-priority delivery overtake the normal band's prefetched backlog; with
    classic priority queues it only orders what was already prefetched. ``_queue`` lists
    them (in hand-out order) like ``asyncio.Queue``'s deque."""

    def _init(self, maxsize: int) -> None:
        self._heap: list[tuple[int, int, Delivery]] = []
        self._seq = itertools.count()

    def _put(self, item: Delivery) -> None:
        heapq.heappush(self._heap, (-item.priority, next(self._seq), item))

    def _get(self) -> Delivery:
        return heapq.heappop(self._heap)[2]

    def qsize(self) -> int:
        return len(self._heap)

    def empty(self) -> bool:
        return not self._heap

    @property
    def _queue(self) -> list[Delivery]:
        return [d for _, _, d in sorted(self._heap)]


class Subscription:
    """A robust connection, one channel and consumers on the work queues of ``types``. Classic
    queues share one global prefetch of ``prefetch``; quorum queues do not support a global
    prefetch, so each consumer (each type's two bands) has its own window of ``prefetch``."""

    def __init__(
        self,
        amqp_url: str,
        namespace: str,
        *,
        name: str,
        prefetch: int,
        queue_type: str = "classic",
    ) -> None:
        self.amqp_url = amqp_url
        self.topology = Topology(namespace, queue_type)
        self.name = name
        self.prefetch = prefetch
        self.connection: AbstractRobustConnection | None = None
        self.channel: AbstractChannel | None = None
        self.queues: dict[str, AbstractQueue] = {}
        self.consumer_tags: dict[str, str] = {}

    async def open(self, types: list[str]) -> None:
        self.connection = await connect(self.amqp_url, name=self.name)
        self.channel = await self.connection.channel(publisher_confirms=False)
        await self.channel.set_qos(prefetch_count=self.prefetch, global_=not self.topology.quorum)
        await self.topology.declare_base(self.channel)
        for t in types:
            for name, queue in zip(
                self.topology.work_queues(t),
                await self.topology.declare_work_queues(self.channel, t),
                strict=True,
            ):
                self.queues[name] = queue

    async def consume(self, on_delivery: OnDelivery) -> None:
        async def callback(message: AbstractIncomingMessage) -> None:
            await on_delivery(Delivery.of(message))

        for t, q in self.queues.items():
            self.consumer_tags[t] = await q.consume(callback)

    async def cancel(self) -> None:
        """Stop taking deliveries (those in hand stay unsettled until settled)."""
        tags, self.consumer_tags = self.consumer_tags, {}
        if self.connection is None or self.connection.is_closed:
            return
        for t, tag in tags.items():
            with contextlib.suppress(Exception):
                await self.queues[t].cancel(tag)

    async def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()

    @property
    def connected(self) -> bool:
        conn, channel = self.connection, self.channel
        return (
            conn is not None
            and not conn.is_closed
            and channel is not None
            and (not channel.is_closed)
        )

    @property
    def consuming(self) -> bool:
        return bool(self.consumer_tags)
