"""Every exchange and queue name, and their declarations, built here and nowhere else.

For namespace ``jobs``:

- ``jobs.exchange`` (direct): routing key = job type → ``jobs.queue.<type>`` (durable,
  ``x-max-priority: 10``, dead-lettering rejected messages to ``jobs.dead_letter``).
- ``jobs.retry`` (headers): routes on the ``x-conveyor-pen`` header to the holding pen
  ``jobs.retry.<delay>`` (``5s``, ``5m``, ``1h``), a durable queue with a fixed ``x-message-ttl``
  and ``x-dead-letter-exchange: jobs.exchange``. Messages keep the job type as routing key, so
  an expired message is dead-lettered back to its own type's queue.
- ``jobs.dead_letter`` (fanout) → ``jobs.dead_letter.queue``: exhausted and poison messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractQueue,
    ExchangeType,
)
from pamqp.common import FieldTable

from ..jobs import check_type, pen_name_suffix

PEN_HEADER = "x-conveyor-pen"


@dataclass(frozen=True)
class Topology:
    namespace: str

    @property
    def exchange(self) -> str:
        return f"{self.namespace}.exchange"

    @property
    def retry_exchange(self) -> str:
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

    def work_queue_arguments(self) -> FieldTable:
        return {"x-max-priority": 10, "x-dead-letter-exchange": self.dead_letter_exchange}

    def pen_arguments(self, delay: int) -> FieldTable:
        return {"x-message-ttl": int(delay * 1000), "x-dead-letter-exchange": self.exchange}

    # ------------------------------------------------------------------ declarations

    async def declare_base(self, channel: AbstractChannel) -> dict[str, AbstractExchange]:
        """Exchanges and the dead-letter queue: idempotent, done by every component at start."""
        ex = await channel.declare_exchange(self.exchange, ExchangeType.DIRECT, durable=True)
        retry = await channel.declare_exchange(
            self.retry_exchange, ExchangeType.HEADERS, durable=True
        )
        dlx = await channel.declare_exchange(
            self.dead_letter_exchange, ExchangeType.FANOUT, durable=True
        )
        dlq = await channel.declare_queue(self.dead_letter_queue, durable=True)
        await dlq.bind(dlx, routing_key="")
        return {"work": ex, "retry": retry, "dead": dlx}

    async def declare_work_queue(self, channel: AbstractChannel, job_type: str) -> AbstractQueue:
        queue = await channel.declare_queue(
            self.work_queue(job_type), durable=True, arguments=self.work_queue_arguments()
        )
        await queue.bind(self.exchange, routing_key=job_type)
        return queue

    async def declare_pen(self, channel: AbstractChannel, delay: int) -> AbstractQueue:
        queue = await channel.declare_queue(
            self.pen_queue(delay), durable=True, arguments=self.pen_arguments(delay)
        )
        await queue.bind(
            self.retry_exchange,
            routing_key="",
            arguments={"x-match": "all", PEN_HEADER: pen_name_suffix(delay)},
        )
        return queue


async def connect(url: str, *, name: str) -> aio_pika.abc.AbstractRobustConnection:
    """A robust connection (reconnects by itself) named after the component."""
    return await aio_pika.connect_robust(
        url, timeout=5, client_properties={"connection_name": name}
    )
