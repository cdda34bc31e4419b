"""``drain``: run a router's due jobs inline against the database, as a worker would, with no
broker. Each attempt goes through the worker's own parts: the claim statement, ``Executor``
(middleware, timeouts, sync handlers in threads, the outcome table) and ``Completer`` (the
fenced outcome writes, retries and dead letters, follow-ups in the completing transaction)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.config import Settings
from ..core.jobs import Status
from ..core.metrics import Metrics
from ..jobs.router import JobRouter
from ..store import Store
from ..store.caller import asyncpg_connection, schema_store
from ..worker.completer import Completer, Pending
from ..worker.executor import Executor
from ..worker.jobctx import attempt_of
from ..worker.outcomes import Outcome
from ..worker.progress import ProgressWriter
from ..worker.running import Running

_DEFAULTS = Settings.model_fields
# a drained attempt holds its job for this long: no heartbeats run beside a test drain
LEASE_SECONDS = 3600.0
MAX_PAYLOAD = _DEFAULTS["max_payload_bytes"].default


@dataclass(frozen=True)
class DrainedAttempt:
    """One attempt a drain ran: its outcome (``completed``, ``retry``, ``failed``) and the job's
    status once it was written (``COMPLETED``, ``RETRYING``, ``FAILED``, ``CANCELLED``)."""

    job_id: uuid.UUID
    type: str
    attempt: int
    outcome: str
    status: Status
    error: str | None


@dataclass
class DrainResult:
    attempts: list[DrainedAttempt] = field(default_factory=list)
    limited: bool = False  # stopped at ``max_jobs`` with due jobs left

    def _count(self, status: Status) -> int:
        return sum(1 for a in self.attempts if a.status is status)

    @property
    def completed(self) -> int:
        return self._count(Status.COMPLETED)

    @property
    def failed(self) -> int:
        """Attempts that left their job FAILED (retries used up, or a failure with no retry)."""
        return self._count(Status.FAILED)

    @property
    def retried(self) -> int:
        """Attempts that left their job RETRYING."""
        return self._count(Status.RETRYING)

    @property
    def cancelled(self) -> int:
        return self._count(Status.CANCELLED)

    def of(self, job_id: uuid.UUID) -> list[DrainedAttempt]:
        """The attempts of one job, in order."""
        return [a for a in self.attempts if a.job_id == job_id]


class _OneConnection:
    """A connection offered as a pool (``acquire``), so a drain can run inside the caller's
    transaction (the completer's transactions become savepoints)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        yield self.conn


async def _as_pool(conn_or_pool: Any) -> Any:
    if hasattr(conn_or_pool, "acquire") and not hasattr(conn_or_pool, "transaction"):
        return conn_or_pool  # an asyncpg pool
    return _OneConnection(await asyncpg_connection(conn_or_pool))


async def drain(
    conn_or_pool: Any,
    router: JobRouter,
    *,
    types: Sequence[str] | None = None,
    with_follow_ups: bool = True,
    skip_retry_delay: bool = True,
    with_scheduled: bool = False,
    max_jobs: int = 100,
    schema: str | None = None,
) -> DrainResult:
    """Run the due jobs of ``router``'s types (or ``types``) one attempt at a time, until none
    is due or ``max_jobs`` attempts have run. ``skip_retry_delay``: a failed attempt's retry is
    due at once (so a failing job runs until it is FAILED); ``with_follow_ups``: jobs enqueued
    during the drain (``job.enqueue``, retries aside) are drained too; ``with_scheduled``: jobs
    whose ``run_at`` is still ahead run now. ``conn_or_pool``: an asyncpg pool or connection (or
    a SQLAlchemy async session on asyncpg); on a connection in a transaction, every write stays
    in that transaction."""
    if max_jobs < 1:
        raise ValueError("max_jobs must be >= 1")
    wanted = sorted(types) if types is not None else router.types
    if unknown := [t for t in wanted if t not in router.handlers]:
        raise ValueError(f"no handler registered for {', '.join(unknown)}")
    pool = await _as_pool(conn_or_pool)
    store = schema_store(schema)
    run = _Drain(pool, store, router, wanted)
    first: set[uuid.UUID] | None = None
    missed: set[uuid.UUID] = set()  # due, but the claim did not take it (taken meanwhile)
    result = DrainResult()
    while True:
        async with pool.acquire() as conn:
            await store.testing_make_due(
                conn, wanted, skip_retry_delay=skip_retry_delay, scheduled=with_scheduled
            )
            ids = await store.testing_due_ids(conn, wanted, limit=max_jobs + 1)
        if first is None:
            first = set(ids)
        ids = [i for i in ids if i not in missed and (with_follow_ups or i in first)]
        if not ids:
            return result
        if len(result.attempts) >= max_jobs:
            result.limited = True
            return result
        attempt = await run.one(ids[0])
        if attempt is None:
            missed.add(ids[0])
        else:
            result.attempts.append(attempt)


class _Drain:
    def __init__(self, pool: Any, store: Store, router: JobRouter, types: list[str]) -> None:
        self.pool, self.store, self.router, self.types = pool, store, router, types
        metrics = Metrics()
        self.defaults = {t: s.defaults() for t, s in router.handlers.items() if s.defaults()}
        self.executor = Executor(
            metrics,
            concurrency=1,
            report=self._report,
            middlewares=router.middlewares,
            abandoned_limit=_DEFAULTS["worker_abandoned_thread_limit"].default,
            max_result_bytes=_DEFAULTS["max_result_bytes"].default,
        )
        self.completer = Completer(pool, store, metrics, done=self._done)
        self.progress = ProgressWriter(pool, store, interval=0.5)
        self.written: list[Pending] = []
        self.worker_id = f"conveyor.testing:{os.getpid()}"

    def _report(self, running: Running, outcome: Outcome) -> None:
        running.last_progress = self.progress.take(running.job.id)
        self.completer.put(running, outcome)

    async def _done(self, batch: list[Pending]) -> None:
        self.written.extend(batch)

    async def one(self, job_id: uuid.UUID) -> DrainedAttempt | None:
        async with self.pool.acquire() as conn:
            rows = await self.store.job_claim_many(
                conn,
                [job_id],
                lease_seconds=LEASE_SECONDS,
                worker_id=self.worker_id,
                types=self.types,
                handler_defaults=self.defaults,
                default_max_retries=_DEFAULTS["default_max_retries"].default,
            )
            known = await self.store.job_type_names(conn)
        if not rows:
            return None
        running = attempt_of(
            rows[0],
            self.router,
            self.executor.clock(),
            self.progress,
            known_types=lambda: known,
            max_payload_bytes=MAX_PAYLOAD,
        )
        job = running.job
        self.written.clear()
        outcome = await self.executor.run_one(running)
        while not self.completer.idle:  # a keyed follow-up is written by a task of its own
            if await self.completer.flush_once() == 0:
                await asyncio.sleep(0.01)
        async with self.pool.acquire() as conn:
            after = await self.store.job_get(conn, job.id)
        if self.written:  # the completer turns an outcome it cannot store into a failure
            outcome = self.written[-1].outcome
        status = after.status if after is not None else Status.IN_PROGRESS
        return DrainedAttempt(job.id, job.type, job.attempt, outcome.label, status, outcome.error)
