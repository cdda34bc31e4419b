"""Every exchange and queue name and their declarations. Nothing else builds a broker name.

For namespace ``jobs``:

- ``jobs.exchange`` (direct): routing key = job type → ``jobs.queue.<type>`` (durable,
  ``x-max-priority: 10``, dead-lettering rejected messages to ``jobs.dead_letter``).
- Holding pen ``jobs.retry.<delay>`` (``5s``, ``5m``, ``1h``): a durable queue with a fixed
  ``x-message-ttl`` and ``x-dead-letter-exchange: jobs.exchange``, fed by a fanout exchange of
  the same name and nothing else. A retry is published to its pen's exchange with the job type
  as routing key, so the expired message is dead-lettered back to its own type's queue.
  One exchange per pen, no header matching: a retry can only ever reach its own pen.
- ``jobs.dead_letter`` (fanout) → ``jobs.dead_letter.queue``: exhausted and poison messages.

Queue types (``CONVEYOR_QUEUE_TYPE``): ``classic`` (the default, above) or ``quorum``: every
work queue, pen and the dead-letter queue is a replicated quorum queue (``x-queue-type:
quorum``), whose dead-lettering (pens expiring, poison rejected) is at-least-once. RabbitMQ
3.10's quorum queues have no message priorities, so that a job above normal priority still
starts before a backlog of normal ones, each type has two bands: such a job is published with
the routing key ``!high.<type>`` (``!`` cannot start a job type) and lands in
``jobs.high.<type>``; everything else in ``jobs.queue.<type>``. A retry
keeps its routing key through the pen, so it comes back to its band. The worker consumes both,
each with its own prefetch window (a backlog in the normal band never holds a high job back at
the broker), and its inbox hands out high deliveries first (``worker/consumer.Inbox``).
"""

from __future__ import annotations

from dataclasses import dataclass

from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractQueue,
    ExchangeType,
)
from pamqp.common import FieldTable

from ..core.jobs import DEFAULT_PRIORITY, check_type, pen_name_suffix

QUEUE_TYPES = ("classic", "quorum")
HIGH_ROUTING_PREFIX = "!high."


@dataclass(frozen=True)
class Topology:
    namespace: str
    queue_type: str = "classic"

    def __post_init__(self) -> None:
        if self.queue_type not in QUEUE_TYPES:
            raise ValueError(f"queue type must be one of {', '.join(QUEUE_TYPES)}")

    @property
    def quorum(self) -> bool:
        return self.queue_type == "quorum"

    @property
    def exchange(self) -> str:
        return f"{self.namespace}.exchange"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.namespace}.dead_letter"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.namespace}.dead_letter.queue"

    def work_queue(self, job_type: str) -> str:
        return f"{self.namespace}.queue.{check_type(job_type)}"

    def high_queue(self, job_type: str) -> str:
        """Quorum mode: the band of a type's jobs above normal priority."""
        return f"{self.namespace}.high.{check_type(job_type)}"

    def work_queues(self, job_type: str) -> list[str]:
        """A type's queues, the one consumed first first."""
        if self.quorum:
            return [self.high_queue(job_type), self.work_queue(job_type)]
        return [self.work_queue(job_type)]

    def routing_key(self, job_type: str, priority: int) -> str:
        """The key a type's message is published (and a retry dead-lettered) with."""
        if self.quorum and priority > DEFAULT_PRIORITY:
            return HIGH_ROUTING_PREFIX + job_type
        return job_type

    def pen_queue(self, delay: int) -> str:
        return f"{self.namespace}.retry.{pen_name_suffix(delay)}"

    def pen_exchange(self, delay: int) -> str:
        """The fanout exchange feeding one pen (same name as its queue)."""
        return self.pen_queue(delay)

    def _replicated(self, args: FieldTable) -> FieldTable:
        """Quorum mode: a quorum queue that dead-letters at least once (a message is removed
        only once its dead-letter target confirmed it; needs ``reject-publish`` overflow)."""
        if not self.quorum:
            return args
        return {
            **args,
            "x-queue-type": "quorum",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    def work_queue_arguments(self) -> FieldTable:
        args: FieldTable = {"x-dead-letter-exchange": self.dead_letter_exchange}
        if self.quorum:
            return self._replicated(args)
        return {"x-max-priority": 10, **args}

    def pen_arguments(self, delay: int) -> FieldTable:
        return self._replicated(
            {"x-message-ttl": int(delay * 1000), "x-dead-letter-exchange": self.exchange}
        )

    def dead_letter_arguments(self) -> FieldTable:
        return {"x-queue-type": "quorum"} if self.quorum else {}

    # ------------------------------------------------------------------ declarations

    async def declare_base(self, channel: AbstractChannel) -> dict[str, AbstractExchange]:
        """Exchanges and the dead-letter queue, idempotent, done by every component at start."""
        ex = await channel.declare_exchange(self.exchange, ExchangeType.DIRECT, durable=True)
        dlx = await channel.declare_exchange(
            self.dead_letter_exchange, ExchangeType.FANOUT, durable=True
        )
        dlq = await channel.declare_queue(
            self.dead_letter_queue, durable=True, arguments=self.dead_letter_arguments() or None
        )
        await dlq.bind(dlx, routing_key="")
        return {"work": ex, "dead": dlx}

    async def declare_work_queue(self, channel: AbstractChannel, job_type: str) -> AbstractQueue:
        """The type's queue (classic), or its two bands (quorum: returns the normal one)."""
        return (await self.declare_work_queues(channel, job_type))[-1]

    async def declare_work_queues(
        self, channel: AbstractChannel, job_type: str
    ) -> list[AbstractQueue]:
        """Every queue of the type, the one consumed first first (``work_queues``)."""
        keys = [self.routing_key(job_type, 9), job_type] if self.quorum else [job_type]
        queues = []
        for name, key in zip(self.work_queues(job_type), keys, strict=True):
            queue = await channel.declare_queue(
                name, durable=True, arguments=self.work_queue_arguments()
            )
            await queue.bind(self.exchange, routing_key=key)
            queues.append(queue)
        return queues

    async def declare_pen(self, channel: AbstractChannel, delay: int) -> AbstractQueue:
        exchange = await channel.declare_exchange(
            self.pen_exchange(delay), ExchangeType.FANOUT, durable=True
        )
        queue = await channel.declare_queue(
            self.pen_queue(delay), durable=True, arguments=self.pen_arguments(delay)
        )
        await queue.bind(exchange, routing_key="")
        return queue
