"""The outbox relay: claims outbox rows with ``FOR UPDATE SKIP LOCKED``, publishes them with
publisher confirms (all of a batch in flight at once), and deletes a row only after its confirm.
Several replicas run side by side safely; a crash between confirm and delete republishes (the
worker's claim makes the duplicate harmless)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractRobustConnection
from pamqp.commands import Basic

from ..core.amqp.topology import PEN_HEADER, Topology, connect
from ..core.backoff import Backoff
from ..core.config import Settings
from ..core.jobs import pen_name_suffix
from ..core.logging import event
from ..core.messages import CONTENT_TYPE
from ..core.metrics import Metrics
from ..store import OutboxRow, for_schema
from ..store.connect import create_pool, listen

log = logging.getLogger("conveyor.publisher")

FaultHook = Callable[[str], Awaitable[None]]


class Relay:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        *,
        fault_hook: FaultHook | None = None,
        publish_timeout: float = 10.0,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.topology = Topology(settings.namespace)
        self.store = for_schema(settings.db_schema)
        self.fault_hook = fault_hook
        self.publish_timeout = publish_timeout
        self.pool: Any = None
        self.connection: AbstractRobustConnection | None = None
        self.channel: AbstractChannel | None = None
        self.exchanges: dict[str, AbstractExchange] = {}
        self._declared: set[tuple[str, Any]] = set()
        self._wake = asyncio.Event()
        self._listener: Any = None
        self.last_ok = time.monotonic()  # last loop turn that reached both services

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.pool = await create_pool(
            self.settings.database_url, application_name="conveyor-publisher", max_size=4
        )
        await self._connect_broker()

    async def _connect_broker(self) -> None:
        self.connection = await connect(self.settings.amqp_url, name="conveyor-publisher")
        self.channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        self.exchanges = await self.topology.declare_base(self.channel)
        self._declared.clear()

    async def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=2)
            self._listener = None
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pool.close(), 5)

    # ------------------------------------------------------------------ one step

    async def run_once(self) -> int:
        """Relay one batch. Returns how many rows were published (and so deleted)."""
        assert self.pool is not None and self.channel is not None
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await self.store.outbox_take_batch(conn, limit=self.settings.relay_batch)
            if not rows:
                return 0
            await self._declare_for(rows)
            channel = await self.channel.get_underlay_channel()
            results = await asyncio.gather(
                *(self._publish(channel, r) for r in rows), return_exceptions=True
            )
            failed = [r for r, res in zip(rows, results, strict=True) if res is not None]
            if failed:
                error = next(res for res in results if res is not None)
                event(log, "outbox_publish_failed", logging.WARNING, count=len(failed),
                      job_id=str(failed[0].job_id), error=repr(error))  # fmt: skip
                self.metrics.outbox_failed.inc(len(failed))
                self._declared.clear()  # a queue may have been deleted: declare again next time
                await self.store.outbox_restore(conn, failed)
            done = len(rows) - len(failed)
            confirmed = Counter(r.destination for r in rows)
            confirmed.subtract(r.destination for r in failed)
            for destination, n in confirmed.items():
                if n:
                    self.metrics.outbox_published.labels(destination).inc(n)
            if self.fault_hook is not None:
                await self.fault_hook("after_confirm")
        if failed and not done:
            raise PublishFailed(f"{len(failed)} outbox rows could not be published")
        return done

    async def _declare_for(self, rows: list[OutboxRow]) -> None:
        assert self.channel is not None
        for r in rows:
            dest = r.destination
            if dest == "dead":
                continue
            key = ("work", r.job_type)
            if key not in self._declared:
                await self.topology.declare_work_queue(self.channel, r.job_type)
                self._declared.add(key)
            if dest == "retry" and r.delay_seconds is not None:
                pen = ("pen", r.delay_seconds)
                if pen not in self._declared:
                    await self.topology.declare_pen(self.channel, r.delay_seconds)
                    self._declared.add(pen)

    async def _publish(self, channel: Any, row: OutboxRow) -> BaseException | None:
        """Publish one row and wait for its confirm; the error instead of raising it."""
        job_id = str(row.job_id)
        dest = row.destination
        headers: dict[str, Any] | None = None
        if dest == "retry" and row.delay_seconds is not None:
            headers = {PEN_HEADER: pen_name_suffix(row.delay_seconds)}
        if dest == "dead":
            body = orjson.dumps({"id": job_id, "type": row.job_type, "error": row.error})
        else:
            body = b'{"id":"' + job_id.encode() + b'","type":"' + row.job_type.encode() + b'"}'
        properties = Basic.Properties(
            content_type=CONTENT_TYPE,
            delivery_mode=2,  # persistent
            message_id=job_id,
            priority=row.priority,
            headers=headers,
        )
        try:
            result = await channel.basic_publish(
                body,
                exchange=self.exchanges[dest].name,
                routing_key=row.job_type,
                properties=properties,
                mandatory=True,
                timeout=self.publish_timeout,
            )
        except Exception as exc:  # nack, channel closed, timeout
            return exc
        if not isinstance(result, Basic.Ack):  # returned: unroutable
            return PublishFailed(f"not confirmed: {result!r}"[:200])
        return None

    # ------------------------------------------------------------------ loop

    async def _listen(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            return
        self._listener = await listen(
            self.settings.database_url,
            self.store.channel,
            self._wake.set,
            name="conveyor-publisher-listen",
        )

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff()
        while not stop.is_set():
            try:
                await self._listen()
                self._wake.clear()
                n = await self.run_once()
                backoff.reset()
                self.last_ok = time.monotonic()
                if n >= self.settings.relay_batch:
                    continue
                if n:
                    event(log, "outbox_batch_published", logging.DEBUG, count=n)
                    continue  # a small batch may mean more arrived while publishing
                await _wait_any(stop, self._wake, self.settings.relay_poll_interval)
            except Exception as exc:
                delay = backoff.next()
                event(
                    log, "relay_error", logging.WARNING, error=repr(exc), retry_in=round(delay, 2)
                )
                if self._listener is not None and self._listener.is_closed():
                    self._listener = None
                await _wait_any(stop, None, delay)


class PublishFailed(Exception):
    pass


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event | None, timeout: float) -> None:
    waiters = [asyncio.ensure_future(stop.wait())]
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


def probes(
    relay: Relay, loop_task: asyncio.Task[Any], *, grace: float = 60.0
) -> tuple[Callable[[], tuple[bool, dict[str, Any]]], Callable[[], bool]]:
    """Liveness: the relay loop runs and has reached PostgreSQL and RabbitMQ within ``grace``
    seconds (an idle relay turns every poll interval). Readiness: the broker channel is open."""

    def live() -> tuple[bool, dict[str, Any]]:
        since = time.monotonic() - relay.last_ok
        ok = not loop_task.done() and since <= grace
        return ok, {"loop_alive": not loop_task.done(), "seconds_since_ok": round(since, 1)}

    def ready() -> bool:
        return relay.channel is not None and not relay.channel.is_closed

    return live, ready
