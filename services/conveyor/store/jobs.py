"""Jobs as submitters and operators see them: insert, read, list, cancel, redrive."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ..core.jobs import Status
from .base import Connection, Statements
from .registry import bind, named
from .rows import Attempt, JobRow, NewJob

JOB_INSERT_MANY = named("job_insert_many")
JOB_INSERT_MANY_TRACED = named("job_insert_many_traced")
JOB_GET = named("job_get")
JOB_GET_BY_IDEMPOTENCY_KEY = named("job_get_by_idempotency_key")
JOB_CANCEL = named("job_cancel")
JOB_REDRIVE = named("job_redrive")
JOB_REDRIVE_FAILED = named("job_redrive_failed")
JOB_FENCE_MANY = named("job_fence_many")


def insert_arrays(jobs: Sequence[NewJob]) -> dict[str, Any]:
    """The column arrays of both job inserts (``job_insert_many`` and ``unique.job_insert_full``),
    by parameter name."""
    return {
        "id": [j.id for j in jobs],
        "job_type": [j.job_type for j in jobs],
        "payload": [j.payload_json for j in jobs],
        "priority": [j.priority for j in jobs],
        "max_retries": [j.max_retries for j in jobs],
        "timeout_seconds": [j.timeout_seconds for j in jobs],
        "run_at": [j.run_at for j in jobs],
        "delay": [j.delay_seconds for j in jobs],
        "idempotency_key": [j.idempotency_key for j in jobs],
        "request_hash": [j.request_hash for j in jobs],
    }


class JobStatements(Statements):
    async def job_insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], trace_context: str | None = None
    ) -> dict[uuid.UUID, JobRow]:
        """Insert jobs and their outbox rows in one statement (atomic without an explicit
        transaction). Returns the inserted rows by id; a job whose idempotency key already
        exists is not inserted and is missing from the result. ``trace_context``: the
        submit's ``traceparent`` (``core/tracing.py``), stored with every job."""
        arrays = insert_arrays(jobs)
        if trace_context is None:
            rows = await conn.fetch(self.sql[JOB_INSERT_MANY], *bind(JOB_INSERT_MANY, arrays))
        else:
            arrays["trace_context"] = trace_context
            name = JOB_INSERT_MANY_TRACED
            rows = await conn.fetch(self.sql[name], *bind(name, arrays))
        return {r["id"]: JobRow.from_record(r) for r in rows}

    async def job_get(self, conn: Connection, job_id: uuid.UUID) -> JobRow | None:
        row = await conn.fetchrow(self.sql[JOB_GET], job_id)
        return JobRow.from_record(row) if row is not None else None

    async def job_get_by_idempotency_key(self, conn: Connection, key: str) -> JobRow | None:
        row = await conn.fetchrow(self.sql[JOB_GET_BY_IDEMPOTENCY_KEY], key)
        return JobRow.from_record(row) if row is not None else None

    async def job_cancel(self, conn: Connection, job_id: uuid.UUID) -> bool:
        """Cancel a waiting job, or ask a running one to stop. False when not cancellable."""
        return await conn.fetchval(self.sql[JOB_CANCEL], job_id) is not None

    async def job_redrive(self, conn: Connection, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """FAILED or CANCELLED jobs back to PENDING; a cancelled job that never ran and whose
        ``run_at`` is still ahead keeps its schedule (SCHEDULED). A cancelled retry's ``run_at``
        is a backoff, not a schedule: it runs now. Returns the ids redriven."""
        return [r["id"] for r in await conn.fetch(self.sql[JOB_REDRIVE], list(ids))]

    async def job_redrive_failed(
        self, conn: Connection, letters: Sequence[Attempt]
    ) -> list[uuid.UUID]:
        """Redrive each job only while it is still FAILED at the attempt its dead letter
        recorded. Returns the ids redriven; the other letters are stale."""
        rows = await conn.fetch(
            self.sql[JOB_REDRIVE_FAILED],
            [a.job_id for a in letters],
            [a.attempt for a in letters],
        )
        return [r["id"] for r in rows]

    async def job_fence_many(
        self, conn: Connection, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[Status, int]]:
        """id → (status, attempts); a missing id: no such job."""
        rows = await conn.fetch(self.sql[JOB_FENCE_MANY], list(ids))
        return {r["id"]: (Status(r["status"]), r["attempts"]) for r in rows}
