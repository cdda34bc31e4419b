"""Reading the broker's state: a queue's depth (for the reconciler) and the dead-letter queue
(for operators' list, redrive and purge)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from aiormq.exceptions import ChannelNotFoundEntity

from . import wire
from .cluster import connect
from .topology import Topology


class DepthUnknown(Exception):
    """A queue's depth could not be read (the broker is unreachable, refused, timed out)."""


class Inspector:
    """A connection of its own, opened on first use."""

    def __init__(self, url: str, topology: Topology, *, name: str, timeout: float = 10.0) -> None:
        self.url = url
        self.topology = topology
        self.name = name
        self.timeout = timeout
        self.connection: AbstractRobustConnection | None = None

    async def _connection(self) -> AbstractRobustConnection:
        if self.connection is None:
            self.connection = await connect(self.url, name=self.name, timeout=self.timeout)
        return self.connection

    async def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()
            self.connection = None

    async def queue_depth(self, job_type: str) -> int:
        """Ready messages in the type's work queue; 0 when the queue does not exist (its
        messages are gone with it). Any other failure raises ``DepthUnknown``: a depth that was
        not read is not zero."""
        try:
            return await asyncio.wait_for(self._depth(job_type), self.timeout)
        except DepthUnknown:
            raise
        except Exception as exc:
            raise DepthUnknown(f"{self.topology.work_queue(job_type)}: {exc!r}"[:300]) from exc

    async def _depth(self, job_type: str) -> int:
        """Summed over the type's queues (quorum mode: both priority bands)."""
        total = 0
        for name in self.topology.work_queues(job_type):
            channel = await (await self._connection()).channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
                total += int(queue.declaration_result.message_count or 0)
            except ChannelNotFoundEntity:
                pass
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
        return total

    @contextlib.asynccontextmanager
    async def dead_letters(self, limit: int | None = None) -> AsyncIterator[DeadLetterBatch]:
        """At most ``limit`` messages taken from the dead-letter queue (the queue's depth when
        it is opened: one pass). Letters ``settle``d are removed; the others go back on exit."""
        channel = await (await self._connection()).channel()
        batch = DeadLetterBatch()
        try:
            queue = await channel.declare_queue(
                self.topology.dead_letter_queue,
                durable=True,
                arguments=self.topology.dead_letter_arguments() or None,
            )
            count = int(queue.declaration_result.message_count or 0)
            if limit is not None:
                count = min(count, limit)
            for _ in range(count):
                msg = await queue.get(no_ack=False, fail=False)
                if msg is None:
                    break
                batch.letters.append(DeadLetterMessage(msg.body, _decode(msg.body), msg))
            yield batch
        finally:
            for letter in batch.letters:
                if not letter.settled:
                    with contextlib.suppress(Exception):
                        await letter.delivery.nack(requeue=True)
            with contextlib.suppress(Exception):
                await channel.close()


def _decode(body: bytes) -> wire.JobMessage | None:
    try:
        return wire.decode(body)
    except wire.MalformedMessage:
        return None


@dataclass
class DeadLetterMessage:
    body: bytes
    message: wire.JobMessage | None  # None: poison (not a Conveyor message)
    delivery: AbstractIncomingMessage
    settled: bool = False

    async def settle(self) -> None:
        """Remove it from the dead-letter queue."""
        await self.delivery.ack()
        self.settled = True


@dataclass
class DeadLetterBatch:
    letters: list[DeadLetterMessage] = field(default_factory=list)
