"""What the routes do, bound to a pool: submit, batch, read, list, cancel, retry, readiness.

Database time limits (the API answers 503 within 2 s when PostgreSQL is unreachable):
- acquiring a connection and every ordinary statement are bounded by ``db_timeout``;
- a batch insert may legitimately run for seconds (1,000 jobs of 62 KB), so it runs without it
  while ``Liveness`` probes the server on a connection of its own: the batch answers 503 only when
  the probe fails (server gone or frozen), never because the statement is long;
- a cancel carries its own bounds on the server, half the ``db_timeout`` (``local_bounds``): a
  job whose row another transaction holds (a worker writing its outcome, an operator's session)
  or whose workflow's cascade is slow answers a 503 that says so, and its connection goes back
  to the pool, instead of the command timeout's "database unavailable" and a dropped connection.
Every 503 is logged (``api_unavailable``) with its cause."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..core import isolate, tracing
from ..core.config import Settings
from ..core.errors import InvalidTransition, JobNotFound, ServiceUnavailable
from ..core.jobs import CANCELLABLE, REDRIVABLE, Status
from ..core.metrics import Metrics
from ..jobs.spec import check_horizon, replayed
from ..jobs.types import KnownTypes
from ..store import JobRow, NewJob, for_schema
from ..store.base import LongStatements
from ..store.bounds import component_bounds, local_bounds
from ..store.connect import create_pool, is_unavailable
from ..store.jobs import has_unique_keys
from ..store.notify import Notifier
from .auth import full_errors
from .batch import build_batch, build_submit
from .liveness import PROBE_EVERY, Liveness, acquire, unavailable
from .resource import decode_cursor, keyset_page, resource

log = logging.getLogger("conveyor.api")
T = TypeVar("T")

# Batch bodies up to this size are parsed on the event loop (a 1,000-job batch of small payloads
# is ~250 KB and ~12 ms of CPU); larger ones in a thread.
INLINE_PARSE_BYTES = 256 * 1024
DIFFERENT_BODY = "this Idempotency-Key was already used with a different request body"
DIFFERENT_BATCH = "this Idempotency-Key was already used with a different batch"
# a cancel that passed its bound on the server (``isolate.BOUNDS``): why, for the 503
CANCEL_HELD: dict[str, Callable[[uuid.UUID], str]] = {
    "lock": lambda job_id: (
        f"job {job_id} is locked by another transaction (a worker writing its outcome, an "
        "operator's session): not cancelled; try again"
    ),
    "statement": lambda job_id: (
        f"cancelling job {job_id} ran past its time limit (its workflow's cascade, or a lock): "
        "not cancelled; try again"
    ),
}


class Api:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = for_schema(settings.db_schema)
        self.known_types = None if settings.accept_unknown_types else KnownTypes(self.store)
        self.pool: Any = None
        self.notifier: Notifier | None = None
        # probe timeout: a long statement's first probe may come two PROBE_EVERY late (one wait,
        # one remembered success), and its 503 must still leave time for the response within
        # 2 s on a loaded machine (a 1.8 s probe timeout plus the overhead can exceed 2 s)
        self.liveness = Liveness(
            self.store, settings.database_url, max(0.2, settings.db_timeout - 2 * PROBE_EVERY)
        )

    def _wake(self) -> None:
        if self.notifier is not None:
            self.notifier.wake()

    async def start(self) -> None:
        self.pool = await create_pool(
            self.settings.database_url,
            application_name="conveyor-api",
            max_size=self.settings.db_pool_size,
            timeout=self.settings.db_timeout,
            # a server that stopped answering must not hold a request past the spec's 2 s
            command_timeout=self.settings.db_timeout,
            pooler=self.settings.db_pooler,
            bounds=component_bounds(self.settings)["api"],
        )
        self.notifier = Notifier(self.pool, self.store)
        self.notifier.start()

    async def stop(self) -> None:
        if self.notifier is not None:
            await self.notifier.stop()
        await self.liveness.close()
        if self.pool is not None:
            await asyncio.wait_for(self.pool.close(), 10)

    def connection(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A pooled connection; an outage or an unmigrated schema becomes a handled 503."""
        return acquire(self.pool, self.settings.db_timeout, self.store.schema)

    async def long(self, conn: Any, run: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``run(conn)`` without the command timeout, as long as the server answers probes."""
        task = asyncio.ensure_future(run(LongStatements(conn)))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=PROBE_EVERY)
                if task in done:
                    return task.result()
                if not await self.liveness.alive():
                    raise unavailable("probe_failed_during_long_statement")
        finally:
            if not task.done():
                task.cancel()
                conn.terminate()  # the statement may still hold it; never reuse it
                with contextlib.suppress(BaseException):
                    await task

    # -- tracing (core/tracing.py): a span around each submit; its traceparent is stored
    async def submit(
        self, body: bytes, idempotency_key: str | None, traceparent: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        with tracing.submitting("/jobs", traceparent) as trace_context:
            return await self._submit(body, idempotency_key, trace_context)

    async def submit_batch(
        self, body: bytes, idempotency_key: str | None, traceparent: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        with tracing.submitting("/jobs/batch", traceparent) as trace_context:
            return await self._submit_batch(body, idempotency_key, trace_context)

    async def _submit(
        self, body: bytes, idempotency_key: str | None, trace_context: str | None
    ) -> tuple[int, dict[str, Any]]:
        new = build_submit(
            body, max_payload_bytes=self.settings.max_payload_bytes, idempotency_key=idempotency_key
        )
        async with self.connection() as conn:
            await self._check_types(conn, [new])
            tracing.annotate_submit([new.job_type], 1, new.id)
            done = await self.store.job_insert_checked(conn, [new], trace_context)  # atomic
            if new.id in done.inserted:
                self._wake()
                self.metrics.jobs_submitted.labels(new.job_type).inc()
                debounced = False if new.debounce is not None else None
                return 201, self.render(done.inserted[new.id], duplicate=False, debounced=debounced)
            if new.id in done.duplicates:  # a unique job: the one holding the key
                return 200, self.render(done.duplicates[new.id], duplicate=True)
            if new.id in done.debounced:  # folded into the job of its key still waiting
                return 200, self.render(done.debounced[new.id], duplicate=False, debounced=True)
            existing = await replayed(self.store, conn, new, DIFFERENT_BODY)
        return 200, self.render(existing)

    async def _submit_batch(
        self, body: bytes, idempotency_key: str | None, trace_context: str | None
    ) -> tuple[int, dict[str, Any]]:
        build = functools.partial(
            build_batch,
            body,
            max_batch=self.settings.max_batch,
            max_payload_bytes=self.settings.max_payload_bytes,
            idempotency_key=idempotency_key,
        )
        # a large body (up to 64 MiB) is parsed and validated in a thread, so /healthz keeps
        # answering; a small one inline: a few ms, and a thread beside the loop costs more
        # (the GIL hand-offs delay every other request's I/O by up to the switch interval)
        rows = build() if len(body) <= INLINE_PARSE_BYTES else await asyncio.to_thread(build)
        if tracing.enabled():
            tracing.annotate_submit([r.job_type for r in rows], len(rows))
        async with self.connection() as conn:
            await self._check_types(conn, rows)
            if idempotency_key is None and not has_unique_keys(rows):
                done = await self.long(
                    conn, lambda c: self.store.job_insert_checked(c, rows, trace_context)
                )
            else:  # unique keys may take a second statement: one transaction, all or none
                tx = conn.transaction()
                await tx.start()
                try:
                    done = await self.long(
                        conn, lambda c: self.store.job_insert_checked(c, rows, trace_context)
                    )
                except BaseException:
                    with contextlib.suppress(Exception):  # the connection may be terminated
                        await tx.rollback()
                    raise
                if len(done.inserted) + len(done.duplicates) + len(done.debounced) != len(rows):
                    await tx.rollback()  # a replay (idempotency keys exist) inserts nothing
                    return 200, await self._replay(conn, rows)
                await tx.commit()
        found, dups = done.inserted, done.duplicates
        if found:
            self._wake()
        for job_type, count in collections.Counter(
            r.job_type for r in rows if r.id in found
        ).items():
            self.metrics.jobs_submitted.labels(job_type).inc(count)
        jobs = [
            self.render(found[r.id], duplicate=False, debounced=False if r.debounce else None)
            if r.id in found
            else self.render(done.debounced[r.id], duplicate=False, debounced=True)
            if r.id in done.debounced
            else self.render(dups[r.id], duplicate=True)
            for r in rows
        ]
        return (201 if found else 200), {"jobs": jobs}

    async def _check_types(self, conn: Any, rows: list[NewJob]) -> None:
        """Bounded job types (the store's policy): 422 for a type no worker registered; and the
        schedule horizon (``CONVEYOR_MAX_SCHEDULE_DAYS``): 422 for a run_at beyond it."""
        check_horizon(rows, self.settings.max_schedule_days)
        if self.known_types is not None:
            await self.known_types.check(conn, [r.job_type for r in rows])

    async def _replay(self, conn: Any, rows: list[NewJob]) -> dict[str, Any]:
        return {
            "jobs": [
                self.render(await replayed(self.store, conn, r, DIFFERENT_BATCH)) for r in rows
            ]
        }

    def render(
        self, row: JobRow, *, duplicate: bool | None = None, debounced: bool | None = None
    ) -> dict[str, Any]:
        body = resource(row, tracebacks=full_errors(self.settings))
        if duplicate is not None:  # submit answers only
            body["duplicate"] = duplicate
        if debounced is not None:  # a debounced submit's answer only
            body["debounced"] = debounced
        return body

    async def get(self, job_id: uuid.UUID) -> dict[str, Any]:
        async with self.connection() as conn:
            row = await self.store.job_get(conn, job_id)
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        return self.render(row)

    async def list(
        self, job_type: str | None, status: Status | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        after = decode_cursor(cursor) if cursor else None
        async with self.connection() as conn:
            rows = await self.store.job_list(
                conn,
                job_type=job_type,
                status=status.value if status else None,
                after=after,
                limit=limit + 1,
            )
        rows, next_cursor = keyset_page(rows, limit)
        return {"jobs": [self.render(r) for r in rows], "next_cursor": next_cursor}

    async def cancel(self, job_id: uuid.UUID) -> dict[str, Any]:
        statement, lock = local_bounds(self.settings.db_timeout, self.settings.db_lock_timeout)
        passed: tuple[str, Exception] | None = None  # the bound the server ended the cancel at
        async with self.connection() as conn:
            try:
                async with conn.transaction():
                    await self.store.statement_bound(
                        conn, statement=statement, lock=lock, idle=self.settings.db_timeout
                    )
                    done = await self.store.job_cancel(conn, job_id)
                    row = await self.store.job_get(conn, job_id)
            except Exception as exc:
                bound = isolate.bound_passed(exc)
                if bound is None:
                    raise
                passed = bound, exc  # rolled back, the connection sound: back to the pool
        if passed is not None:
            bound, error = passed
            raise unavailable(f"cancel_{bound}_bound", error, CANCEL_HELD[bound](job_id)) from error
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        if not done:
            allowed = sorted(s.value for s in CANCELLABLE | {Status.IN_PROGRESS})
            raise InvalidTransition(
                f"job is {row.status}; only {', '.join(allowed)} can be cancelled",
                str(row.status),
            )
        return self.render(row)

    async def retry(self, job_id: uuid.UUID) -> dict[str, Any]:
        async with self.connection() as conn, conn.transaction():
            done = await self.store.job_redrive(conn, [job_id])
            row = await self.store.job_get(conn, job_id)
        self._wake()
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        if not done:
            allowed = sorted(s.value for s in REDRIVABLE)
            raise InvalidTransition(
                f"job is {row.status}; only {', '.join(allowed)} can be retried",
                str(row.status),
            )
        return self.render(row)

    async def ready(self) -> str | None:
        """None when ready; else why not (the database is unreachable or not migrated)."""
        try:
            async with self.connection() as conn:
                if await self.store.schema_ready(conn, timeout=self.settings.db_timeout):
                    return None
            return f"database schema {self.store.schema!r} is not at the migration head"
        except Exception as exc:
            if isinstance(exc, ServiceUnavailable) or is_unavailable(exc):
                return "database unreachable"
            raise
