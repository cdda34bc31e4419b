"""The consumer side of RabbitMQ for the worker: one channel, its work queues, and deliveries.

``Delivery`` is what the worker sees of a message: its body, its delivery tag, the channel it
came on (captured at arrival, so bookkeeping never asks a closed channel), and the three ways to
settle it. Settling a delivery whose channel has closed does nothing (the broker requeues every
unsettled delivery of a closed channel by itself) and never raises.

aio-pika registers each consumer (and restores it after a reconnect) with a callback that wraps
every delivery in an ``IncomingMessage`` (~25 µs, a tenth of the worker's CPU per no-op job) and
a task of its own. Once a delivery of a consumer of ours arrives that way, the subscription puts
its own callback in that consumer's place on the aiormq channel (``Subscription._swap``): later
deliveries become a ``Delivery`` directly. Whatever aio-pika re-registers after a reconnect comes
through its path again until the next swap, so the swap only ever changes the speed.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from aiormq.abc import DeliveredMessage

from ..core.jobs import DEFAULT_PRIORITY
from .cluster import START_ATTEMPTS, connect
from .topology import Topology
from .wire import MalformedMessage, decode, traceparent_of

__all__ = ["Delivery", "MalformedMessage", "Subscription", "job_id_of"]


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
    _settle: Any = field(default=None, repr=False)  # the aiormq channel to settle on (None: none)
    traceparent: str | None = None  # the publish span's context (tracing), unchecked
    priority: int = DEFAULT_PRIORITY

    @classmethod
    def of(cls, message: AbstractIncomingMessage) -> Delivery:
        """A delivery aio-pika wrapped (``IncomingMessage.channel`` is its aiormq channel)."""
        return cls(
            message.body,
            message.routing_key,
            message.message_id,
            message.delivery_tag,
            message.channel,
            message.channel,
            traceparent_of(message.headers),
            DEFAULT_PRIORITY if message.priority is None else message.priority,
        )

    @classmethod
    def of_raw(cls, message: DeliveredMessage) -> Delivery:
        """A delivery as aiormq hands it over."""
        properties, deliver = message.header.properties, message.delivery
        return cls(
            message.body,
            getattr(deliver, "routing_key", None),
            properties.message_id,
            getattr(deliver, "delivery_tag", None),
            message.channel,
            message.channel,
            traceparent_of(properties.headers),
            DEFAULT_PRIORITY if properties.priority is None else properties.priority,
        )

    async def _send(self, method: str, **options: bool) -> None:
        if self._settle is not None and self.delivery_tag is not None:
            with contextlib.suppress(Exception):  # a closed channel: the broker requeues it
                await getattr(self._settle, method)(self.delivery_tag, **options)

    async def ack(self, multiple: bool = False) -> None:
        await self._send("basic_ack", multiple=multiple)

    async def reject(self, requeue: bool = False) -> None:
        """To the dead-letter queue (``requeue=False``)."""
        await self._send("basic_reject", requeue=requeue)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        """Back to its queue, for another consumer."""
        await self._send("basic_nack", multiple=multiple, requeue=requeue)


OnDelivery = Callable[[Delivery], Awaitable[None]]


class Subscription:
    """A robust connection, one channel with a global prefetch, and consumers on the work queues
    of ``types``.

    ``shares`` (weighted types): each type's consumer gets a prefetch of its share (RabbitMQ's
    per-consumer ``basic.qos``), under the channel's global prefetch, so a flood of one type
    holds at most its share of the worker's slots. ``pause(type)`` / ``resume(type)`` cancel and
    re-create one queue's consumer (a paused type's messages stay in its queue).

    Classic queues share one global prefetch of ``prefetch``; quorum queues do not support a
    global prefetch, so each consumer (each type's two bands) has its own window.

    ``heartbeat``: the AMQP heartbeat the connection asks for (``cluster.connect``). A worker's
    is short, so that the deliveries of a worker that stops answering (frozen) go back to their
    queues within seconds instead of waiting for it."""

    def __init__(
        self,
        amqp_url: str,
        namespace: str,
        *,
        name: str,
        prefetch: int,
        shares: dict[str, int] | None = None,
        queue_type: str = "classic",
        heartbeat: int | None = None,
    ) -> None:
        self.amqp_url = amqp_url
        self.heartbeat = heartbeat  # seconds, asked of the broker (``cluster.connect``)
        self.topology = Topology(namespace, queue_type)
        self.name = name
        self.prefetch = prefetch
        self.shares = shares or {}
        self.connection: AbstractRobustConnection | None = None
        self.channel: AbstractChannel | None = None
        self.queues: dict[str, AbstractQueue] = {}  # by queue name
        self.type_queues: dict[str, list[str]] = {}  # type → its queue names (quorum: 2 bands)
        self.consumer_tags: dict[str, str] = {}  # by queue name
        self.paused: set[str] = set()
        self._on_delivery: OnDelivery | None = None
        self._stopped = False  # cancel() was called: nothing resumes after it

    async def open(self, types: list[str]) -> None:
        self.connection = await connect(
            self.amqp_url, name=self.name, attempts=START_ATTEMPTS, heartbeat=self.heartbeat
        )
        self.channel = await self.connection.channel(publisher_confirms=False)
        await self.channel.set_qos(prefetch_count=self.prefetch, global_=not self.topology.quorum)
        await self.topology.declare_base(self.channel)
        for t in types:
            names = self.topology.work_queues(t)
            self.type_queues[t] = names
            for name, queue in zip(
                names, await self.topology.declare_work_queues(self.channel, t), strict=True
            ):
                self.queues[name] = queue

    async def consume(self, on_delivery: OnDelivery) -> None:
        self._on_delivery = on_delivery
        for t in self.type_queues:
            if t not in self.paused:
                await self._consume_one(t)
        if self.shares and self.connection is not None:
            self.connection.reconnect_callbacks.add(self._reapply_shares)

    async def _callback(self, message: AbstractIncomingMessage) -> None:
        """aio-pika's path: the first delivery of a consumer (and after each reconnect)."""
        self._swap(message.channel, message.consumer_tag)
        if self._on_delivery is not None:
            await self._on_delivery(Delivery.of(message))

    async def _raw(self, message: DeliveredMessage) -> None:
        """The direct path, once ``_swap`` put it in place."""
        if self._on_delivery is not None:
            await self._on_delivery(Delivery.of_raw(message))

    def _swap(self, channel: Any, tag: str | None) -> None:
        """Have ``channel`` (aiormq) call ``_raw`` for consumer ``tag``, if it is one of ours."""
        consumers = getattr(channel, "consumers", None)
        if (
            isinstance(consumers, dict)
            and tag in consumers
            and consumers[tag] != self._raw
            and tag in self.consumer_tags.values()
        ):
            consumers[tag] = self._raw

    async def _consume_one(self, t: str) -> None:
        """Consume every queue of type ``t`` (its bands)."""
        for name in self.type_queues[t]:
            if self.shares and self.channel is not None:
                # per-consumer prefetch for the consumer created next, then the channel's limit
                # again (the robust channel restores only the last qos it was given)
                await self.channel.set_qos(prefetch_count=self.shares.get(t, 0), global_=False)
                self.consumer_tags[name] = await self.queues[name].consume(self._callback)
                await self.channel.set_qos(
                    prefetch_count=self.prefetch, global_=not self.topology.quorum
                )
            else:
                self.consumer_tags[name] = await self.queues[name].consume(self._callback)

    async def _cancel_type(self, t: str) -> None:
        for name in self.type_queues.get(t, []):
            tag = self.consumer_tags.pop(name, None)
            if tag is not None:
                with contextlib.suppress(Exception):
                    await self.queues[name].cancel(tag)

    def _consumed_types(self) -> list[str]:
        return [
            t
            for t, names in self.type_queues.items()
            if any(n in self.consumer_tags for n in names)
        ]

    async def _reapply_shares(self, *_: object) -> None:
        """After a reconnect the consumers come back without their per-consumer prefetch:
        re-create them with it."""
        for t in self._consumed_types():
            with contextlib.suppress(Exception):
                await self._cancel_type(t)
                await self._consume_one(t)

    async def pause(self, t: str) -> None:
        """Stop consuming ``t``'s queues (their messages stay there)."""
        self.paused.add(t)
        await self._cancel_type(t)

    async def resume(self, t: str) -> None:
        self.paused.discard(t)
        if self._stopped or self._on_delivery is None:
            return
        if t in self.type_queues and t not in self._consumed_types():
            await self._consume_one(t)

    async def cancel(self) -> None:
        """Stop taking deliveries (those in hand stay unsettled until settled)."""
        tags, self.consumer_tags = self.consumer_tags, {}
        self._stopped = True  # a resume after this point consumes nothing
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
        return not (conn is None or conn.is_closed or channel is None or channel.is_closed)

    @property
    def consuming(self) -> bool:
        """Consuming every queue that is not paused (all of them paused counts)."""
        if self._on_delivery is None or self._stopped:
            return False
        return bool(self.consumer_tags) or bool(
            self.type_queues and set(self.type_queues) <= self.paused
        )
