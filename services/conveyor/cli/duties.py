"""The duties inside ``conveyor api`` and ``conveyor worker``: the outbox relay and the maintenance
duties (promotion, lease recovery, reconciler, retention, schedules, workflows, the gauges), so
that an API and a worker, or a worker alone beside an application that enqueues, run everything;
``CONVEYOR_RUN_DUTIES=false`` leaves them to a dedicated ``conveyor publisher``. They share the
process's metrics registry and never stop it: a broker it cannot reach is retried with backoff
while the API serves and the worker runs its jobs.

One process at a time holds them: each process keeps one session of its own
(``conveyor-duties``) and, every turn, tries a session-level advisory lock
(``Store.duties_try_lock``); the holder runs the relay and the sweeper, the others stand by. The
lock goes with the holder's session: a process that stops or crashes loses it at once, a lost
host when the server's TCP keepalives notice (about 11 s), a frozen process when the session's
``idle_session_timeout`` (three turns) ends it; a standby takes it at its next turn. A holder that
cannot run the duties for ``give_up`` seconds (the broker unreachable from it, a role that may
not relay) lets go and waits as long before it tries again, so another process takes over.
The election saves work, it does not make the duties safe: every duty is safe in any number of
processes (the relays take outbox rows with ``FOR UPDATE SKIP LOCKED``, the sweeper's statements
lock what they change), so a holder and its successor overlapping for a turn duplicate nothing.
Without a session of its own (``CONVEYOR_DB_POOLER=transaction`` and no
``CONVEYOR_LISTEN_DATABASE_URL``) there is no election: every process runs the duties.

Every process also watches the outbox on that session (``publisher/watch.py``), duties or not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
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
from ..store.connect import connect_one, listen_url

log = logging.getLogger("conveyor.duties")

# a turn: the outbox watch, and the election (at most this often; a third of
# CONVEYOR_OUTBOX_STALE_AFTER when that is less)
TICK = 5.0
# the election's session ends after this many turns without one (a frozen holder)
IDLE_TURNS = 3
# a holder whose relay has not reached PostgreSQL and RabbitMQ for this long, or whose duties
# fell behind (the sweeper's liveness), gives the duties up
GIVE_UP = 30.0
# how long stepping down waits for the relay and the sweeper to finish their passes and close
STOP_WAIT = 10.0


class Duties:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        *,
        give_up: float = GIVE_UP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        s = self.settings = settings
        self.metrics = metrics or Metrics()
        self.enabled = s.run_duties
        self.give_up = give_up
        self.clock = clock
        self.store = for_schema(s.db_schema)
        self.watch = OutboxWatch(self.store, s.outbox_stale_after)
        self.tick = min(TICK, s.outbox_stale_after / 3)
        direct = listen_url(s.database_url, s.db_pooler, s.listen_database_url)
        self.elects = direct is not None  # a session of its own holds a lock
        self._url = direct or s.database_url
        self._pooler = s.db_pooler if direct in (None, s.database_url) else "none"
        self.state = "standby" if self.enabled else "off"
        self.error: str | None = None  # why the duties last failed here
        self.relay: Relay | None = None
        self.sweeper: Sweeper | None = None
        self.running = False  # the holder's relay and sweeper have started
        self._held_since = self._running_since = 0.0
        self._benched_until = 0.0
        self._holding: tuple[asyncio.Task[None], asyncio.Event] | None = None
        self._conn: Any = None
        self._snapshot: dict[str, Any] = self._details()

    # ------------------------------------------------------------------ health

    def details(self) -> dict[str, Any]:
        """What the health probes show, as of the last turn or change of state (a snapshot: a
        probe thread may read it)."""
        return self._snapshot

    def _refresh(self) -> None:
        self._snapshot = self._details()

    def _details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.enabled, "state": self.state, "election": self.elects}
        if self.state == "holder":
            out["running"] = self.running
            out["held_seconds"] = round(self.clock() - self._held_since, 1)
        if self.running and self.relay is not None and self.sweeper is not None:
            out["relay"] = {"seconds_since_ok": round(self.clock() - self.relay.last_ok, 1)}
            out["maintenance"] = self.sweeper.live()[1]
        out["error"] = self.error
        out["outbox"] = self.watch.details()
        return out

    # ------------------------------------------------------------------ turns

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: a turn every ``tick`` seconds; then the duties stop and the lock goes."""
        if self.enabled:
            event(log, "duties_started", election=self.elects)
        else:
            event(log, "duties_off", message="CONVEYOR_RUN_DUTIES=false: a publisher must run")
        try:
            while not stop.is_set():
                await self._turn()
                self._refresh()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.tick)
        finally:
            await self._step_down()
            await self._close_session()
            self._refresh()

    async def _turn(self) -> None:
        try:
            conn = await self._session()
        except Exception as exc:  # no session: the lock cannot be held
            self.watch.error = self.watch.error or repr(exc)[:300]
            await self._lose(exc)
            return
        with contextlib.suppress(Exception):  # logged by the watch, once
            await self.watch.step(conn)
        if not self.enabled:
            return
        try:
            await self._elect(conn)
        except Exception as exc:  # the session broke: the lock went with it
            await self._lose(exc)

    async def _lose(self, exc: Exception) -> None:
        self.error = repr(exc)[:300]
        if self.state == "holder":
            event(log, "duties_lost", logging.WARNING, error=self.error)
        await self._step_down()
        await self._close_session()

    async def _elect(self, conn: Any) -> None:
        now = self.clock()
        if self.state == "holder":
            if self.elects and not await self.store.duties_held(conn):
                event(log, "duties_lost", logging.WARNING, error="the lock is not held")
                await self._step_down()
            elif self._failing(now):
                event(log, "duties_given_up", logging.WARNING, error=self.error, pause=self.give_up)
                await self._step_down()
                await self._close_session()  # the lock goes with the session
                self._benched_until = self.clock() + self.give_up
            return
        if now < self._benched_until:
            return
        if not self.elects or await self.store.duties_try_lock(conn):
            self._take(now)

    def _failing(self, now: float) -> bool:
        """Has the holder been unable to run the duties for ``give_up`` seconds?"""
        if not self.elects:  # nobody would take them over
            return False
        if not self.running or self.relay is None or self.sweeper is None:
            return now - self._held_since > self.give_up
        relay_ok = max(self.relay.last_ok, self._running_since)  # a slow start is no failure
        return now - relay_ok > self.give_up or not self.sweeper.live()[0]

    def _take(self, now: float) -> None:
        self.state, self._held_since = "holder", now
        stop = asyncio.Event()
        self._holding = (asyncio.create_task(self._hold(stop), name="duties"), stop)
        event(log, "duties_taken", election=self.elects)
        self._refresh()

    async def _step_down(self) -> None:
        """Stop the relay and the sweeper (a start still connecting is given up)."""
        if self._holding is not None:
            task, stop = self._holding
            self._holding = None
            stop.set()
            _, late = await asyncio.wait({task}, timeout=STOP_WAIT)
            for t in late:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            event(log, "duties_released")
        if self.enabled:
            self.state = "standby"
        self._refresh()

    # ------------------------------------------------------------------ the session

    async def _session(self) -> Any:
        if self._conn is None or self._conn.is_closed():
            s = self.settings
            self._conn = await connect_one(
                self._url,
                application_name="conveyor-duties",
                pooler=self._pooler,
                bounds=SessionBounds.of(s),
                command_timeout=min(s.command_timeout, 10.0),
            )
            if self.enabled and self.elects:
                idle = IDLE_TURNS * self.tick
                if not await self.store.duties_session_bound(self._conn, idle=idle):
                    event(log, "duties_session_unbounded", logging.DEBUG)  # PostgreSQL < 14
        return self._conn

    async def _close_session(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 2)
            self._conn = None

    # ------------------------------------------------------------------ the holder's duties

    async def _hold(self, stop: asyncio.Event) -> None:
        """Run the relay and the maintenance duties until ``stop``; a start that fails (the
        broker unreachable) is tried again with backoff."""
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
            self.running, self.error, self._running_since = True, None, self.clock()
            event(log, "duties_running")
            self._refresh()
            yield relay, sweeper
        finally:
            self.running = False
            self._refresh()
            await relay.close()
            await sweeper.close()
            if sweeper.gauges is not None:  # another process computes them now
                sweeper.gauges.forget()
