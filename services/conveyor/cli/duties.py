"""The duties inside ``conveyor api`` and ``conveyor worker``: the outbox relay and the maintenance
duties (promotion, lease recovery, reconciler, retention, schedules, workflows, the gauges), so
that an API and a worker, or a worker alone beside an application that enqueues, run everything;
``CONVEYOR_RUN_DUTIES=false`` leaves them to a dedicated ``conveyor publisher``. They share the
process's metrics registry, never stop it (a broker it cannot reach is retried with backoff
while the API serves and the worker runs its jobs), and are safe in any number of processes: the
relays take outbox rows with ``FOR UPDATE SKIP LOCKED``, the duties lock what they change.

Every process also watches the outbox (``publisher/watch.py``), duties or not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from ..core.backoff import Backoff
from ..core.config import Settings
from ..core.logging import event
from ..core.metrics import Metrics
from ..maintenance.sweeper import Sweeper
from ..publisher.relay import Relay
from ..publisher.watch import OutboxWatch
from ..store import for_schema
from ..store.bounds import SessionBounds
from ..store.connect import connect_one

log = logging.getLogger("conveyor.duties")

# how often the outbox is looked at (at most; a third of CONVEYOR_OUTBOX_STALE_AFTER when less)
TICK = 5.0
# how long a stop waits for the relay and the sweeper to finish their passes and close
STOP_WAIT = 10.0


class Duties:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.enabled = settings.run_duties
        self.store = for_schema(settings.db_schema)
        self.watch = OutboxWatch(self.store, settings.outbox_stale_after)
        self.tick = min(TICK, settings.outbox_stale_after / 3)
        self.state = "starting" if self.enabled else "off"
        self.error: str | None = None  # why the duties last failed to start or stopped
        self.relay: Relay | None = None
        self.sweeper: Sweeper | None = None
        self._conn: Any = None
        self._snapshot: dict[str, Any] = {"run": self.enabled, "state": self.state}

    # ------------------------------------------------------------------ health

    def details(self) -> dict[str, Any]:
        """What the health probes show (refreshed by the loop: a probe thread may read it)."""
        return self._snapshot

    def _details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.enabled, "state": self.state, "error": self.error}
        if self.state == "running" and self.relay is not None and self.sweeper is not None:
            since = asyncio.get_running_loop().time() - self.relay.last_ok
            out["relay"] = {"seconds_since_ok": round(since, 1)}
            out["maintenance"] = self.sweeper.live()[1]
        out["outbox"] = self.watch.details()
        return out

    # ------------------------------------------------------------------ loop

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: the duties (when enabled) and the outbox watch."""
        event(log, "duties_started" if self.enabled else "duties_off")
        held = asyncio.create_task(self._hold(stop), name="duties") if self.enabled else None
        try:
            while not stop.is_set():
                await self._look()
                self._snapshot = self._details()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.tick)
        finally:
            if held is not None:  # a start still connecting to the broker is given up
                _, late = await asyncio.wait({held}, timeout=STOP_WAIT)
                for task in late:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self._close_conn()

    async def _look(self) -> None:
        try:
            if self._conn is None or self._conn.is_closed():
                s = self.settings
                self._conn = await connect_one(
                    s.database_url,
                    application_name="conveyor-duties",
                    pooler=s.db_pooler,
                    bounds=SessionBounds.of(s),
                    command_timeout=s.command_timeout,
                )
            await self.watch.step(self._conn)
        except Exception as exc:  # the watch logged it (once); the next look reconnects
            self.watch.error = self.watch.error or repr(exc)[:300]
            await self._close_conn()

    async def _close_conn(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 2)
            self._conn = None

    async def _hold(self, stop: asyncio.Event) -> None:
        """Run the relay and the maintenance duties until ``stop``; a start that fails (the
        broker unreachable) or a part that ends is tried again with backoff."""
        backoff = Backoff(base=1.0, cap=30.0)
        while not stop.is_set():
            try:
                async with self._running() as (relay, sweeper):
                    await asyncio.gather(relay.run(stop), sweeper.run(stop))
                backoff.reset()
            except Exception as exc:
                self.error = repr(exc)[:300]
                delay = round(backoff.next(), 1)
                event(log, "duties_failed", logging.WARNING, error=self.error, retry_in=delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[tuple[Relay, Sweeper]]:
        relay = self.relay = Relay(self.settings, self.metrics)
        sweeper = self.sweeper = Sweeper(self.settings, self.metrics)
        try:
            await relay.start()
            await sweeper.start()
            self.state, self.error = "running", None
            event(log, "duties_running")
            yield relay, sweeper
        finally:
            self.state = "starting"
            await relay.close()
            await sweeper.close()
