"""The outbox relay: claims outbox rows with ``FOR UPDATE SKIP LOCKED``, publishes them with
publisher confirms (all of a batch in flight at once), and deletes a row only after its confirm.
Several replicas run side by side safely; a crash between confirm and delete republishes (the
worker's claim makes the duplicate harmless).

Rows whose confirms do not come within the publish wait go back to the outbox, but their
messages may not be lost: a broker under a memory or disk alarm blocks the connection and routes
what was written once the alarm clears. So the relay publishes nothing more until those confirms
settle: it waits while the broker says the connection is blocked, deletes the rows confirmed
late, and publishes again only the rest (nacked, or unanswered on a connection that is not
blocked). One alarm costs a relay no extra copy of a message, however many publish waits it
lasts; the relay stays live meanwhile (a restart would only publish the rows again)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..broker.frames import Unconfirmed, acked
from ..broker.publish import DeclarationFailed, Publisher, PublishFailed
from ..broker.topology import Topology
from ..core import tracing
from ..core.backoff import Backoff
from ..core.config import Settings
from ..core.logging import event
from ..core.metrics import Metrics
from ..store import OutboxRow, for_schema
from ..store.bounds import RELAY_PUBLISH_TIMEOUT, SessionBounds, relay_idle_floor
from ..store.connect import create_pool, listen, listen_url

log = logging.getLogger("conveyor.publisher")

__all__ = ["PublishFailed", "Relay", "probes"]


class Relay:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        *,
        publisher: Publisher | None = None,
        publish_timeout: float = RELAY_PUBLISH_TIMEOUT,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.topology = Topology(settings.namespace, settings.queue_type)
        self.store = for_schema(settings.db_schema)
        self.publisher = publisher or Publisher(
            settings.amqp_url, self.topology, self.metrics, publish_timeout=publish_timeout
        )
        # how long a publish waits for confirms (an injected publisher may not say: the default)
        self.publish_wait = getattr(self.publisher, "publish_timeout", publish_timeout)
        self.pool: Any = None
        self._wake = asyncio.Event()
        self._restored = False  # the last batch put rows back into the outbox
        # outbox id → the confirm of a publish that outlived the publish wait (see the module)
        self._unconfirmed: dict[int, asyncio.Future[Any]] = {}
        self._listener: Any = None
        self.last_ok = time.monotonic()  # last loop turn that reached both services

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the pool and connect to the broker; a start that fails closes both (the
        process tries again with backoff)."""
        try:
            await self._open()
        except BaseException:
            await self.close()
            self.pool = None
            raise

    async def _open(self) -> None:
        self.pool = await create_pool(
            self.settings.database_url,
            application_name="conveyor-publisher",
            max_size=4,
            command_timeout=self.settings.command_timeout,
            pooler=self.settings.db_pooler,
            bounds=SessionBounds.of(
                self.settings,
                idle_floor=relay_idle_floor(self.settings, self.publish_wait),
            ),
        )
        await self.publisher.connect()

    async def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=2)
            self._listener = None
        await self.publisher.close()
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pool.close(), 5)

    # ------------------------------------------------------------------ one step

    async def run_once(self) -> int:
        """Relay one batch. Returns how many rows were published (and so deleted). Rows whose
        publish failed go back to the outbox; rows of a type whose queue the broker refuses to
        declare wait there (with backoff) while every other type's rows flow."""
        assert self.pool is not None
        if self._unconfirmed and not await self._settle_unconfirmed():
            return 0
        types, pens = self.publisher.blocked()
        async with self.pool.acquire() as conn, conn.transaction():
            traced = tracing.enabled()
            rows = await self.store.outbox_take_batch(
                conn,
                limit=self.settings.relay_batch,
                skip_types=types,
                skip_pens=pens,
                traced=traced,
            )
            if not rows:
                return 0
            if traced:
                results = await self._publish_traced(rows)
            else:
                results = await self.publisher.publish_batch(rows)
            failed = [r for r, res in zip(rows, results, strict=True) if res is not None]
            self._restored = bool(failed)
            for r, e in zip(rows, results, strict=True):
                if isinstance(e, Unconfirmed):
                    self._unconfirmed[r.id] = e.confirm
            # rows whose publish failed for another reason than a refused declaration (those
            # are logged by the publisher) or a late confirm, each with its own error
            broken = [
                (r, e)
                for r, e in zip(rows, results, strict=True)
                if e is not None and not isinstance(e, DeclarationFailed | Unconfirmed)
            ]
            if failed:
                self.metrics.outbox_failed.inc(len(failed))
                await self.store.outbox_restore(conn, failed)
            if broken:
                row, error = broken[0]
                event(
                    log,
                    "outbox_publish_failed",
                    logging.WARNING,
                    count=len(broken),
                    job_id=str(row.job_id),
                    error=repr(error),
                )
                self.publisher.forget_declarations()  # a queue may have been deleted
                try:  # a channel the broker keeps refusing (see renew_channel)
                    await self.publisher.renew_channel()
                except Exception as exc:
                    event(log, "channel_renew_failed", logging.WARNING, error=repr(exc))
            done = len(rows) - len(failed)
            confirmed = Counter(r.destination for r in rows)
            confirmed.subtract(r.destination for r in failed)
            for destination, n in confirmed.items():
                if n:
                    self.metrics.outbox_published.labels(destination).inc(n)
        if broken and not done:
            raise PublishFailed(f"{len(failed)} outbox rows could not be published")
        return done

    async def _settle_unconfirmed(self) -> bool:
        """Wait (up to the publish wait) for the late confirms; True once they settled, or the
        broker does not block the connection and still has not answered (they are lost: the
        rows are published again). Rows confirmed late are deleted from the outbox."""
        blocked = not await self.publisher.writable()
        _, late = await asyncio.wait(list(self._unconfirmed.values()), timeout=self.publish_wait)
        if late and (blocked or not await self.publisher.writable()):
            event(log, "outbox_confirms_awaited", logging.WARNING, count=len(late))
            return False
        for c in late:
            c.cancel()  # given up: a confirm that still comes is ignored
        confirmed = [i for i, c in self._unconfirmed.items() if acked(c)]
        self._unconfirmed.clear()
        if confirmed:
            async with self.pool.acquire() as conn:
                await self.store.outbox_delete_confirmed(conn, confirmed)
            event(log, "outbox_confirmed_late", logging.WARNING, count=len(confirmed))
        return True

    async def _publish_traced(self, rows: list[OutboxRow]) -> list[BaseException | None]:
        """Tracing on: each row's publish in a span, child of its job's trace context, whose
        ``traceparent`` the message carries to the worker."""
        spans, headers = tracing.start_publishing(rows)
        results: list[BaseException | None] = [None] * len(rows)
        try:
            results = await self.publisher.publish_batch(rows, headers)
        except BaseException as exc:
            results = [exc] * len(rows)
            raise
        finally:
            tracing.end_publishing(spans, results)
        return results

    # ------------------------------------------------------------------ loop

    async def _listen(self) -> None:
        """LISTEN for new outbox rows on a connection of its own; behind a transaction pooler
        without ``listen_database_url``, nothing: the loop polls every ``relay_poll_interval``."""
        if self._listener is not None and not self._listener.is_closed():
            return
        s = self.settings
        url = listen_url(s.database_url, s.db_pooler, s.listen_database_url)
        if url is None:
            return
        self._listener = await listen(
            url,
            self.store.channel,
            self._wake.set,
            name="conveyor-publisher-listen",
        )

    def _look_again(self) -> bool:
        """After a batch smaller than ``relay_batch``: take the next one at once, or wait for a
        notification? At once when rows may be waiting unannounced: a notification came while
        publishing (a commit after this batch's snapshot notifies after it), nothing listens
        (polling), or a row of the batch went back to the outbox. Otherwise the empty look
        would cost a transaction per job at low rates (BEGIN, SELECT, COMMIT)."""
        listening = self._listener is not None and not self._listener.is_closed()
        return self._wake.is_set() or not listening or self._restored

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
                    if self._look_again():
                        continue
                await _wait_any(stop, self._wake, self.settings.relay_poll_interval)
            except Exception as exc:
                delay = backoff.next()
                event(
                    log, "relay_error", logging.WARNING, error=repr(exc), retry_in=round(delay, 2)
                )
                if self._listener is not None and self._listener.is_closed():
                    self._listener = None
                await _wait_any(stop, None, delay)


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
        return relay.publisher.ready

    return live, ready
