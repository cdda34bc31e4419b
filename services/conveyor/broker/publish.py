"""Publishing with publisher confirms and ``mandatory``: a message counts as sent only when the
broker confirmed it, and a returned (unroutable) message is a failure.

Declarations run on a channel of their own: in AMQP a refused declaration (a queue that already
exists with other arguments: ``PRECONDITION_FAILED``) closes its channel, and on the publishing
channel it would fail every message in flight. A queue or pen that cannot be declared fails
only the messages that need it; it is retried with backoff (``blocked()`` names what is waiting,
so the relay leaves those rows in the outbox meanwhile) and logged and counted with its name and
the broker's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from aiormq.exceptions import AMQPChannelError
from pamqp.commands import Basic

from ..core.backoff import ceiling
from ..core.logging import event
from ..core.metrics import Metrics
from . import frames, wire
from .cluster import START_ATTEMPTS, connect
from .frames import PublishFailed as PublishFailed  # re-exported: the relay catches it
from .topology import Topology

log = logging.getLogger("conveyor.publisher")

DeclKey = tuple[str, str | int]  # ("work", job type) or ("pen", delay)


class Outgoing(Protocol):
    """What a publish needs to know about one outbox row."""

    @property
    def job_id(self) -> uuid.UUID: ...
    @property
    def job_type(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def destination(self) -> str: ...  # "work", "retry" or "dead"
    @property
    def delay_seconds(self) -> int | None: ...
    @property
    def attempt(self) -> int | None: ...
    @property
    def error(self) -> str | None: ...


class DeclarationFailed(PublishFailed):
    """A queue or pen this message needs could not be declared (see ``Publisher.blocked``)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"cannot declare {name}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Route:
    """Where one outbox row goes: the exchange (named by ``Topology``), its body, and what must
    be declared first (its work queue; a retry also its pen; a dead letter nothing)."""

    exchange: str
    body: bytes
    needs: tuple[DeclKey, ...]


@dataclass
class _Failing:
    name: str
    error: DeclarationFailed
    failures: int
    until: float  # monotonic time of the next attempt


class Publisher:
    """One connection, one confirm channel for messages, one channel for declarations."""

    def __init__(
        self,
        url: str,
        topology: Topology,
        metrics: Metrics,
        *,
        name: str = "conveyor-publisher",
        publish_timeout: float = 10.0,
        declare_backoff: tuple[float, float] = (1.0, 60.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.topology = topology
        self.metrics = metrics
        self.name = name
        self.publish_timeout = publish_timeout
        self.declare_backoff = declare_backoff
        self.clock = clock
        self.connection: AbstractRobustConnection | None = None
        self.channel: AbstractChannel | None = None
        self._declare_channel: AbstractChannel | None = None
        self._declared: set[DeclKey] = set()
        self._failing: dict[DeclKey, _Failing] = {}
        self._exchanges: dict[str, str] = {}

    # ------------------------------------------------------------------ lifecycle

    async def connect(self) -> None:
        self.connection = await connect(self.url, name=self.name, attempts=START_ATTEMPTS)
        self.channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        self._declare_channel = await self.connection.channel(publisher_confirms=False)
        exchanges = await self.topology.declare_base(self._declare_channel)
        self._exchanges = {dest: ex.name for dest, ex in exchanges.items()}
        self._declared.clear()

    async def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()

    @property
    def ready(self) -> bool:
        return self.channel is not None and not self.channel.is_closed

    async def renew_channel(self) -> None:
        """Open another confirm channel on the same connection and, once it is open, close the
        old one (if the new one cannot be opened within ``publish_timeout``, the old one
        stays). After a cluster node died, RabbitMQ 3.10 went on nacking every publish of the
        relay's long-lived channel to quorum queues the dead node had led (the 4 s pen, a high
        band), while a new connection's publishes to the same queues were confirmed
        (``tests/faults/test_rabbit_cluster.py``)."""
        if self.connection is None:
            return
        # bounded: while the connection is down an open would wait for the reconnection, and
        # the relay's loop (and its stop) with it
        fresh = await asyncio.wait_for(
            self.connection.channel(publisher_confirms=True, on_return_raises=True),
            self.publish_timeout,
        )
        old, self.channel = self.channel, fresh
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()

    async def writable(self, wait: float = 0.1) -> bool:
        """Whether the broker takes this connection's publishes, waiting up to ``wait`` seconds:
        False while it has sent ``connection.blocked`` (a memory or disk alarm) and not yet
        ``connection.unblocked``, or while the connection is down."""
        if self.channel is None:
            return False
        try:
            channel = await asyncio.wait_for(self.channel.get_underlay_channel(), wait)
            await asyncio.wait_for(channel.connection.ready(), wait)
        except Exception:
            return False
        return True

    def forget_declarations(self) -> None:
        """Declare again before the next publish (a queue may have been deleted)."""
        self._declared.clear()

    def blocked(self) -> tuple[list[str], list[int]]:
        """Job types and pen delays whose declaration failed and waits for its next try."""
        if not self._failing:  # the usual case, twice per lone row
            return [], []
        now = self.clock()
        waiting = [k for k, f in self._failing.items() if f.until > now]
        return (
            [str(v) for kind, v in waiting if kind == "work"],
            [int(v) for kind, v in waiting if kind == "pen"],
        )

    # ------------------------------------------------------------------ publishing

    def route(self, row: Outgoing) -> Route:
        """The one place that routes by ``destination``."""
        if row.destination == "dead":
            body = wire.encode(row.job_id, row.job_type, attempt=row.attempt, error=row.error)
            return Route(self._exchanges["dead"], body, ())
        body = wire.encode(row.job_id, row.job_type)
        work: DeclKey = ("work", row.job_type)
        if row.destination == "retry":
            delay = row.delay_seconds or 0
            return Route(self.topology.pen_exchange(delay), body, (work, ("pen", delay)))
        return Route(self._exchanges["work"], body, (work,))

    async def publish_batch(
        self, rows: Sequence[Outgoing], traceparents: Sequence[str | None] | None = None
    ) -> list[BaseException | None]:
        """Publish every row, all in flight at once; per row None (confirmed) or the error.
        ``traceparents``: each row's ``traceparent`` header (tracing on), else none."""
        assert self.channel is not None
        routes = [self.route(row) for row in rows]
        refused = await self._declare_for(routes)
        channel = await self.channel.get_underlay_channel()
        results: list[BaseException | None] = [None] * len(rows)
        pending: list[int] = []
        for i, route in enumerate(routes):
            error = (
                next((refused[k] for k in route.needs if k in refused), None) if refused else None
            )
            if error is not None:
                results[i] = error
            else:
                pending.append(i)
        tps = traceparents or [None] * len(rows)
        out = [self._outbound(rows[i], routes[i], tps[i]) for i in pending]
        if frames.one_write_possible(channel):
            sent = await frames.publish_together(channel, out, self.publish_timeout)
        else:  # another aiormq: one basic_publish per message
            sent = await asyncio.gather(*(self._publish(channel, m) for m in out))
        for i, result in zip(pending, sent, strict=True):
            results[i] = result
        return results

    def _outbound(self, row: Outgoing, route: Route, traceparent: str | None) -> frames.Outbound:
        return frames.Outbound(
            route.exchange,
            self.topology.routing_key(row.job_type, row.priority),
            route.body,
            wire.properties(str(row.job_id), row.priority, traceparent),
        )

    async def _publish(self, channel: Any, message: frames.Outbound) -> BaseException | None:
        """Publish one message and wait for its confirm; the error instead of raising it."""
        try:
            result = await channel.basic_publish(
                message.body,
                exchange=message.exchange,
                routing_key=message.routing_key,
                properties=message.properties,
                mandatory=True,
                timeout=self.publish_timeout,
            )
        except Exception as exc:  # nack, channel closed, timeout
            return exc
        if not isinstance(result, Basic.Ack):  # returned: unroutable
            return PublishFailed(f"not confirmed: {result!r}"[:200])
        return None

    # ------------------------------------------------------------------ declarations

    async def _declare_for(self, routes: Sequence[Route]) -> dict[DeclKey, DeclarationFailed]:
        """Declare what ``routes`` need and is not declared yet. Returns the refused ones; a
        connection failure (not a refusal) raises."""
        needed = dict.fromkeys(k for route in routes for k in route.needs)
        refused: dict[DeclKey, DeclarationFailed] = {}
        now = self.clock()
        for key in needed:
            if key in self._declared:
                continue
            failing = self._failing.get(key)
            if failing is not None and failing.until > now:
                refused[key] = failing.error
                continue
            try:
                await self._declare(key)
            except AMQPChannelError as exc:
                refused[key] = await self._refused(key, exc)
                continue
            self._declared.add(key)
            if self._failing.pop(key, None) is not None:
                event(log, "queue_declared_again", logging.WARNING, queue=self._name(key))
        return refused

    def _name(self, key: DeclKey) -> str:
        kind, value = key
        if kind == "work":
            return self.topology.work_queue(str(value))
        return self.topology.pen_queue(int(value))

    async def _declare(self, key: DeclKey) -> None:
        if self._declare_channel is None or self._declare_channel.is_closed:
            assert self.connection is not None
            self._declare_channel = await self.connection.channel(publisher_confirms=False)
        kind, value = key
        if kind == "work":
            declared = self.topology.declare_work_queue(self._declare_channel, str(value))
        else:
            declared = self.topology.declare_pen(self._declare_channel, int(value))
        await asyncio.wait_for(declared, self.publish_timeout)

    async def _refused(self, key: DeclKey, exc: AMQPChannelError) -> DeclarationFailed:
        """Record a refused declaration: backoff, log line, metric; reopen the channel."""
        name = self._name(key)
        reason = str(exc)[:300] or type(exc).__name__
        previous = self._failing.get(key)
        failures = (previous.failures if previous else 0) + 1
        delay = ceiling(failures, *self.declare_backoff)
        error = DeclarationFailed(name, reason)
        self._failing[key] = _Failing(name, error, failures, self.clock() + delay)
        self.metrics.declare_failed.labels(name, type(exc).__name__).inc()
        event(
            log,
            "queue_declare_failed",
            logging.ERROR,
            queue=name,
            reason=reason,
            failures=failures,
            retry_in=round(delay, 1),
        )
        if self._declare_channel is not None:
            with contextlib.suppress(Exception):
                await self._declare_channel.close()
            self._declare_channel = None
        return error
