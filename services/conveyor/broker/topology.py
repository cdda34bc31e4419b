"""Every exchange and queue name, their declarations, and the clean-up of what older versions
declared. Nothing else builds a broker name.

For namespace ``jobs``:

- ``jobs.exchange`` (direct): routing key = job type → ``jobs.queue.<type>`` (durable,
  ``x-max-priority: 10``, dead-lettering rejected messages to ``jobs.dead_letter``).
- Holding pen ``jobs.retry.<delay>`` (``5s``, ``5m``, ``1h``): a durable queue with a fixed
  ``x-message-ttl`` and ``x-dead-letter-exchange: jobs.exchange``, fed by a fanout exchange of
  the same name and nothing else. A retry is published to its pen's exchange with the job type
  as routing key, so the expired message is dead-lettered back to its own type's queue.
  One exchange per pen, no header matching: a retry can only ever reach its own pen.
- ``jobs.dead_letter`` (fanout) → ``jobs.dead_letter.queue``: exhausted and poison messages.

Round one routed retries through one headers exchange ``jobs.retry`` on an ``x-conveyor-pen``
header. RabbitMQ ignores ``x-`` headers when matching, so every pen's binding matched every
retry: each retry was copied into every pen. ``declare_base`` deletes that exchange (and with it
all of its bindings), so an upgraded install stops duplicating; the pens themselves are kept,
with their messages, and are re-bound to their own exchanges when next declared.
"""

from __future__ import annotations

from dataclasses import dataclass

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractQueue,
    AbstractRobustConnection,
    ExchangeType,
)
from pamqp.common import FieldTable

from ..core.jobs import check_type, pen_name_suffix


@dataclass(frozen=True)
class Topology:
    namespace: str

    @property
    def exchange(self) -> str:
        return f"{self.namespace}.exchange"

    @property
    def legacy_retry_exchange(self) -> str:
        """Round one's headers exchange: deleted by ``declare_base``, never declared."""
        return f"{self.namespace}.retry"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.namespace}.dead_letter"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.namespace}.dead_letter.queue"

    def work_queue(self, job_type: str) -> str:
        return f"{self.namespace}.queue.{check_type(job_type)}"

    def pen_queue(self, delay: int) -> str:
        return f"{self.namespace}.retry.{pen_name_suffix(delay)}"

    def pen_exchange(self, delay: int) -> str:
        """The fanout exchange feeding one pen (same name as its queue)."""
        return self.pen_queue(delay)

    def work_queue_arguments(self) -> FieldTable:
        return {"x-max-priority": 10, "x-dead-letter-exchange": self.dead_letter_exchange}

    def pen_arguments(self, delay: int) -> FieldTable:
        return {"x-message-ttl": int(delay * 1000), "x-dead-letter-exchange": self.exchange}

    # ------------------------------------------------------------------ declarations

    async def declare_base(self, channel: AbstractChannel) -> dict[str, AbstractExchange]:
        """Exchanges and the dead-letter queue, idempotent, done by every component at start;
        and the removal of round one's catch-all retry exchange."""
        ex = await channel.declare_exchange(self.exchange, ExchangeType.DIRECT, durable=True)
        dlx = await channel.declare_exchange(
            self.dead_letter_exchange, ExchangeType.FANOUT, durable=True
        )
        dlq = await channel.declare_queue(self.dead_letter_queue, durable=True)
        await dlq.bind(dlx, routing_key="")
        await self.remove_legacy(channel)
        return {"work": ex, "dead": dlx}

    async def remove_legacy(self, channel: AbstractChannel) -> None:
        """Delete ``<ns>.retry`` (a no-op when it is gone). A relay of the old version still
        running during a rolling upgrade declares it again and keeps its own behaviour; every
        start of the new version removes it again."""
        await channel.exchange_delete(self.legacy_retry_exchange)

    async def declare_work_queue(self, channel: AbstractChannel, job_type: str) -> AbstractQueue:
        queue = await channel.declare_queue(
            self.work_queue(job_type), durable=True, arguments=self.work_queue_arguments()
        )
        await queue.bind(self.exchange, routing_key=job_type)
        return queue

    async def declare_pen(self, channel: AbstractChannel, delay: int) -> AbstractQueue:
        exchange = await channel.declare_exchange(
            self.pen_exchange(delay), ExchangeType.FANOUT, durable=True
        )
        queue = await channel.declare_queue(
            self.pen_queue(delay), durable=True, arguments=self.pen_arguments(delay)
        )
        await queue.bind(exchange, routing_key="")
        return queue


async def connect(url: str, *, name: str, timeout: float = 5.0) -> AbstractRobustConnection:
    """A robust connection (reconnects by itself) named after the component."""
    return await aio_pika.connect_robust(
        url, timeout=timeout, client_properties={"connection_name": name}
    )


async def reachable(url: str, *, timeout: float = 3.0) -> None:
    """Open and close one plain connection: raises when RabbitMQ cannot be reached."""
    connection = await aio_pika.connect(url, timeout=timeout)
    await connection.close()
