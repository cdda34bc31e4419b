"""The sweeper: promotes due scheduled jobs, recovers expired leases, reconciles jobs whose
broker message was lost, and deletes old finished jobs. Each duty has a one-step method; time
comes from the database (``now()``). Statements carry a command timeout (a half-open connection
fails a pass); a paused sweeper holds nothing between round trips except in the transactions
PostgreSQL bounds (``maintenance_bound``), so a peer takes a duty over within seconds.
``live()`` is false once a duty misses its interval plus ``maintenance_deadline``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..broker.inspect import Inspector
from ..broker.topology import Topology
from ..core import isolate
from ..core.config import Settings
from ..core.jobs import Status
from ..core.logging import event
from ..core.metrics import Metrics
from ..store import JobStatus, for_schema
from ..store.bounds import SessionBounds, local_bounds
from ..store.connect import create_pool
from ..store.notify import Notifier
from .admission import Admitter
from .gauges import Gauges
from .schedules import HOLD_IDLE_SECONDS, LOCK_WAIT_SECONDS, SchedulePass, Watch, enqueue_due
from .stranded import StrandedOutbox

log = logging.getLogger("conveyor.sweeper")

BATCH = 1000
RETENTION_INTERVAL = 3600.0
WORKFLOWS_INTERVAL = 5.0


@dataclass(frozen=True)
class DutyStatus:
    name: str
    interval: float
    seconds_since_pass: float  # since the last completed pass (or the start)
    last_error: str | None

    def overdue(self, deadline: float) -> bool:
        return self.seconds_since_pass > self.interval + deadline


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.topology = Topology(settings.namespace, settings.queue_type)
        self.store = for_schema(settings.db_schema)
        # per type, the overdue jobs the last reconcile pass found missing (see ``reconcile``)
        self._suspects: dict[str, list[uuid.UUID]] = {}
        self.stranded = StrandedOutbox(self.store)  # rows a stopped relay holds
        self.inspector = Inspector(
            settings.amqp_url,
            self.topology,
            name="conveyor-sweeper",
            timeout=settings.command_timeout,
        )
        self.pool: Any = None
        self.notifier = Notifier(None, self.store)  # wakes the relay after a commit
        self.clock = clock
        self.intervals = {
            "promote": settings.schedule_interval,
            "leases": settings.lease_sweep_interval,
            "reconcile": settings.reconcile_interval,
            "retention": RETENTION_INTERVAL,
            "schedules": settings.schedules_interval,
            "workflows": WORKFLOWS_INTERVAL,
            "admission": settings.admission_interval,
        }
        self._passed = dict.fromkeys(self.intervals, clock())
        self.gauges: Gauges | None = None  # built by ``start`` (needs the pool)
        self.admitter: Admitter | None = None  # likewise
        self.watch = Watch()  # the schedules duty's: tells a peer's delay from missed ticks
        self._errors: dict[str, str | None] = dict.fromkeys(self.intervals)
        self.aside = isolate.Aside(clock)  # jobs whose lease recovery failed, till their next try

    async def start(self) -> None:
        # seven duties on 3 connections; admission passes every 0.05 s (an idle one: a probe of an
        # empty index), promote and schedules every 0.25-0.5 s
        s = self.settings
        self.pool = await create_pool(
            s.database_url,
            application_name="conveyor-sweeper",
            max_size=3,
            command_timeout=s.command_timeout,
            pooler=s.db_pooler,
            bounds=SessionBounds.of(s),
        )
        self.notifier.pool = self.pool
        self.notifier.start()
        self.admitter = Admitter(s, self.store, self.metrics, self.pool)
        self.gauges = Gauges(
            self.metrics, self.store, self.pool, self.topology, queue_depth=self._queue_depth
        )
        self._passed = dict.fromkeys(self.intervals, self.clock())

    async def close(self) -> None:
        await self.notifier.stop()
        await self.inspector.close()
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pool.close(), 5)

    # ------------------------------------------------------------------ one-step duties

    async def promote_due(self) -> int:
        """SCHEDULED jobs whose ``run_at`` has passed (database clock) → PENDING + outbox row."""
        total = 0
        while True:
            async with self.pool.acquire() as conn:  # one statement: no BEGIN/COMMIT
                n = await self.store.job_promote_due(conn, limit=BATCH)
            if n:
                self.notifier.wake()
            total += n
            if n < BATCH:
                break
        self._count("promote", total)
        return total

    async def recover_leases(self) -> dict[str, int]:
        """IN_PROGRESS jobs whose lease expired (dead or hung worker): back to the queue while
        retries remain, else FAILED and dead-lettered. A batch whose statement the server
        refuses for one job's sake (``core/isolate.py``: a trigger's error, a lock or the
        statement bound passed) is recovered again one job at a time: the others are recovered
        in this pass, the failing one is set aside (logged ``job_lease_recovery_failed`` with its
        id) and tried again alone once its wait is over (1 s, doubling to 60 s)."""
        counts: dict[str, int] = {}
        for job_id in self.aside.due():
            self._counted(await self._recover_alone(job_id), counts)
        while True:
            async with self.pool.acquire() as conn:
                ids = await self.store.job_expired_ids(conn, limit=BATCH, aside=self.aside.held())
            if not ids:
                break
            rows = await self._recover_isolating(ids)
            self._counted(rows, counts)
            if len(ids) < BATCH or not rows:
                break
        self._count("lease_recovered", sum(counts.values()))
        return counts

    async def _recover_isolating(self, ids: list[uuid.UUID]) -> list[JobStatus]:
        """Recover ``ids`` in one statement; when the server refuses it for some job's sake,
        each alone."""
        try:
            return await self._recover(ids)
        except Exception as exc:
            if not isolate.concerns_rows(exc):
                raise  # an outage: the pass fails, the next one tries again
        rows: list[JobStatus] = []
        for job_id in ids:
            rows += await self._recover_alone(job_id)
        return rows

    async def _recover_alone(self, job_id: uuid.UUID) -> list[JobStatus]:
        """Recover one job; when the server refuses it, set it aside for its next wait."""
        try:
            rows = await self._recover([job_id])
        except Exception as exc:
            if not isolate.concerns_rows(exc):
                raise
            wait = self.aside.failed(job_id)
            event(
                log,
                "job_lease_recovery_failed",
                logging.WARNING,
                job_id=str(job_id),
                error=repr(exc)[:300],
                retry_in=wait,
            )
            return []
        self.aside.settled(job_id)  # recovered, or no longer expired
        return rows

    async def _recover(self, ids: list[uuid.UUID]) -> list[JobStatus]:
        """One transaction, its statements bounded on the server (``bounds.local_bounds``), so
        a lock held elsewhere or a slow trigger ends in an error about the statement, not in
        the pool's command timeout (an outage); paused inside it, the sweeper's session ends
        after ``HOLD_IDLE_SECONDS`` and the rows it held go to a peer."""
        statement, lock = local_bounds(self.settings.command_timeout, self.settings.db_lock_timeout)
        async with self.pool.acquire() as conn, conn.transaction():
            await self.store.statement_bound(
                conn, statement=statement, lock=lock, idle=HOLD_IDLE_SECONDS
            )
            rows = await self.store.job_recover_expired(
                conn, ids, default_max_retries=self.settings.default_max_retries
            )
        if rows:
            self.notifier.wake()  # committed
        return rows

    def _counted(self, rows: list[JobStatus], counts: dict[str, int]) -> None:
        for r in rows:
            counts[r.status] = counts.get(r.status, 0) + 1
            outcome = "cancelled" if r.status is Status.CANCELLED else "lease_expired"
            self.metrics.jobs_finished.labels(r.job_type, outcome).inc()
            event(log, "job_lease_expired", logging.WARNING, job_id=str(r.id), now=r.status)

    async def reconcile(self, *, queue_depth: Callable[[str], Awaitable[int]] | None = None) -> int:
        """Re-publish PENDING/RETRYING jobs that should long have reached a worker and have no
        outbox row in flight. Per type, only as many as the queue is short of: a long backlog
        that is really sitting in its queue is left alone instead of flooded with duplicates,
        and fresh messages (jobs not yet overdue) do not stand for lost ones.
        A job is re-published by the second pass that finds it overdue and missing (the first
        marks it a suspect), so the delay after ``reconcile_after`` is one to two intervals."""
        if requeued := await self.stranded.step(self.pool):
            self.notifier.wake()
            self._count("outbox_requeued", requeued)
        depth = queue_depth or self._queue_depth
        after = self.settings.reconcile_after
        async with self.pool.acquire() as conn:
            overdue = await self.store.job_count_overdue(conn, after=after)
        total = 0
        for job_type in overdue:
            # the queue first, the jobs second: a message delivered in between is then counted
            # as ready while its job is claimed (no longer overdue), an error on the safe side;
            # the other order turns every delivery in the gap into a duplicate
            try:
                ready = await depth(job_type)
            except Exception as exc:  # a depth not read is not 0: skip the type this pass
                self.metrics.queue_depth_failed.labels(job_type).inc()
                event(
                    log, "queue_depth_failed", logging.WARNING, type=job_type, error=repr(exc)[:300]
                )
                continue
            # recount and re-publish under the type's lock: a replica that finds it taken skips
            # the type (the holder is filling the same shortfall)
            async with self.pool.acquire() as conn, conn.transaction():
                await self.store.maintenance_bound(
                    conn, idle=HOLD_IDLE_SECONDS, lock_wait=LOCK_WAIT_SECONDS
                )
                if not await self.store.job_reconcile_lock(conn, job_type):
                    continue
                n, fresh = await self.store.job_recount_overdue(conn, job_type, after=after)
                # a fresh job (due, not yet overdue) has its message in the queue: of the ready
                # messages, only those beyond the fresh jobs can stand for overdue ones
                missing = n - max(0, ready - fresh)
                suspects = self._suspects.pop(job_type, [])
                if missing <= 0:
                    continue
                # Two passes in a row must find a job overdue before it is re-published: a
                # delivery a worker has received but not yet claimed has left the queue's ready
                # count while its job still looks untouched for a few milliseconds (until the
                # worker's touch commits); a lost message stays lost until the next pass.
                done = 0
                if suspects:
                    done = await self.store.job_republish_overdue(
                        conn, job_type, after=after, limit=missing, among=suspects
                    )
                if missing > done:
                    self._suspects[job_type] = await self.store.job_overdue_ids(
                        conn, job_type, after=after, limit=missing - done
                    )
            total += done
            if done:
                self.notifier.wake()
                self.metrics.reconciled.labels(job_type).inc(done)
            event(
                log,
                "jobs_reconciled",
                logging.WARNING,
                type=job_type,
                overdue=n,
                queued=ready,
                fresh=fresh,
                republished=done,
            )
        self._count("reconciled", total)
        return total

    async def _queue_depth(self, job_type: str) -> int:
        """Ready messages in the type's queue (0 when the queue is missing; raises when the
        depth cannot be read)."""
        return await self.inspector.queue_depth(job_type)

    async def delete_expired(self) -> int:
        """Delete COMPLETED/CANCELLED jobs older than ``retention_days`` and FAILED jobs older
        than ``failed_retention_days``, ``retention_batch`` per transaction with a
        ``retention_pause`` between batches: deleting millions of rows never holds locks long
        nor starves the hot path of I/O."""
        s = self.settings
        total = 0
        while True:
            async with self.pool.acquire() as conn:
                n = await self.store.job_delete_expired(
                    conn,
                    older_than=s.retention_days * 86400,
                    failed_older_than=s.failed_retention_days * 86400,
                    limit=s.retention_batch,
                )
            total += n
            if n < s.retention_batch:
                break
            if s.retention_pause:
                await asyncio.sleep(s.retention_pause)
        while await self._unique_delete_expired() == BATCH:
            pass
        while True:  # finished workflows go whole, with their jobs
            async with self.pool.acquire() as conn:
                n = await self.store.workflow_delete_expired(
                    conn,
                    older_than=s.retention_days * 86400,
                    failed_older_than=s.failed_retention_days * 86400,
                    limit=BATCH,
                )
            if n < BATCH:
                break
        self._count("retention_deleted", total)
        return total

    async def _unique_delete_expired(self) -> int:
        async with self.pool.acquire() as conn:
            return await self.store.job_unique_delete_expired(conn, limit=BATCH)

    async def finish_workflows(self) -> int:
        """The backstop of a workflow's status (``store/workflows.py``): a running workflow
        whose last two jobs ended at once, each seeing the other open, finishes here; one
        finished here while a job of it was retried runs again."""
        async with self.pool.acquire() as conn:
            n = await self.store.workflow_finish(conn, limit=BATCH)
            await self.store.workflow_reopen(conn)
        self._count("workflows_finished", n)
        return n

    async def enqueue_due_schedules(self, now: datetime | None = None) -> SchedulePass:
        """Enqueue one job per tick that has come (``maintenance/schedules.py``); ``now``
        defaults to the database's clock (tests pass their own: no sleeping)."""
        done = await enqueue_due(
            self.pool, self.store, now=now, grace=self.settings.schedule_grace, watch=self.watch
        )
        self._count("schedule_enqueued", done.enqueued)
        self._count("schedule_missed", done.missed)
        return done

    def _count(self, duty: str, n: int) -> None:
        if n:
            self.metrics.maintenance.labels(duty).inc(n)

    # ------------------------------------------------------------------ loop and health

    def status(self) -> list[DutyStatus]:
        now = self.clock()
        return [
            DutyStatus(name, interval, now - self._passed[name], self._errors[name])
            for name, interval in self.intervals.items()
        ]

    def live(self) -> tuple[bool, dict[str, Any]]:
        """False when a duty has not completed a pass within its interval plus the deadline."""
        deadline = self.settings.maintenance_deadline
        duties = self.status()
        details = {
            d.name: {"seconds_since_pass": round(d.seconds_since_pass, 1), "error": d.last_error}
            for d in duties
        }
        return not any(d.overdue(deadline) for d in duties), details

    async def run(self, stop: asyncio.Event) -> None:
        """Every duty on its interval, and the gauges (jobs by type and status, the outbox, the
        queues): whichever process runs the sweeper — ``conveyor sweeper``, the publisher
        without ``--no-maintenance``, ``conveyor dev`` — refreshes them."""
        duties: dict[str, Callable[[], Awaitable[Any]]] = {
            "promote": self.promote_due,
            "leases": self.recover_leases,
            "reconcile": self.reconcile,
            "retention": self.delete_expired,
            "schedules": self.enqueue_due_schedules,
            "workflows": self.finish_workflows,
        }
        loops = [self._every(stop, n, f) for n, f in duties.items()]
        if self.admitter is not None:
            loops.append(self._every(stop, "admission", self.admit))
        if self.gauges is not None:
            loops.append(self.gauges.run(stop))
        await asyncio.gather(*loops)

    async def admit(self) -> int:
        """One admission pass (``admission.py``): the jobs that may start now, admitted."""
        assert self.admitter is not None
        n = await self.admitter.step()
        self._count("admission", n)
        return n

    async def _every(
        self, stop: asyncio.Event, name: str, duty: Callable[[], Awaitable[Any]]
    ) -> None:
        while not stop.is_set():
            try:
                await duty()
                self._passed[name] = self.clock()
                self._errors[name] = None
            except Exception as exc:
                self._errors[name] = repr(exc)[:300]
                event(log, "maintenance_failed", logging.WARNING, duty=name, error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.intervals[name])
