"""Workflows: attach a submitted DAG to its jobs, read a workflow, cancel it, and the
maintenance backstops (finish, reopen, retention). The release and the failure policy are the
triggers of sql/schema/workflows.sql (docs/workflows.md)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from .base import Connection, Statements, affected
from .connect import partition_key_checked
from .jobs import insert_arrays
from .registry import bind, named
from .rows import NewJob

WORKFLOW_ATTACH = named("workflow_attach")
WORKFLOW_INSERT = named("workflow_insert")
WORKFLOW_GET = named("workflow_get")
WORKFLOW_JOBS = named("workflow_jobs")
WORKFLOW_PARENTS = named("workflow_parents")
WORKFLOW_CANCEL = named("workflow_cancel")
WORKFLOW_FINISH = named("workflow_finish")
WORKFLOW_REOPEN = named("workflow_reopen")
WORKFLOW_DELETE_EXPIRED = named("workflow_delete_expired")

# The ``run_at`` a job with dependencies is inserted with by the usual submit (SCHEDULED: no
# outbox row) before ``workflow_attach`` makes it WAITING at its own due time.
PARKED = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """A workflow and how many of its jobs are in each state."""

    id: uuid.UUID
    name: str
    status: str  # RUNNING, COMPLETED, FAILED, CANCELLED
    on_failure: str
    created_at: datetime
    finished_at: datetime | None
    jobs: int
    waiting: int
    queued: int  # PENDING, SCHEDULED, RETRYING
    running: int
    completed: int
    failed: int
    cancelled: int


@dataclass(frozen=True, slots=True)
class WorkflowJob:
    id: uuid.UUID
    key: str
    job_type: str
    status: str
    deps_pending: int | None
    last_error: str | None
    after: list[str]


@dataclass(frozen=True, slots=True)
class Parent:
    """A dependency as its dependent's handler sees it."""

    status: str
    result: Any


class WorkflowStatements(Statements):
    async def workflow_attach(
        self,
        conn: Connection,
        workflow_id: uuid.UUID,
        name: str,
        on_failure: str,
        jobs: Sequence[tuple[NewJob, str, int]],
        edges: Sequence[tuple[uuid.UUID, uuid.UUID]],
    ) -> int:
        """Write the workflow row and its ``edges`` (job, the job it depends on), and tag
        ``jobs`` (row as submitted, key, dependency count), inserted before (one with
        dependencies parked: ``PARKED``): one with dependencies becomes WAITING at its own due
        time. Returns how many of them are PENDING (released at once)."""
        values = {
            "workflow_id": workflow_id,
            "name": name,
            "on_failure": on_failure,
            "child": [c for c, _ in edges],
            "parent": [p for _, p in edges],
            "job_id": [j[0].id for j in jobs],
            "job_key": [j[1] for j in jobs],
            "deps": [j[2] for j in jobs],
            "run_at": [j[0].run_at for j in jobs],
            "delay": [j[0].delay_seconds for j in jobs],
        }
        row = await conn.fetchrow(self.sql[WORKFLOW_ATTACH], *bind(WORKFLOW_ATTACH, values))
        return int(row["pending"])

    async def workflow_insert(
        self,
        conn: Connection,
        workflow_id: uuid.UUID,
        name: str,
        on_failure: str,
        jobs: Sequence[tuple[NewJob, str, int]],
        edges: Sequence[tuple[uuid.UUID, uuid.UUID]],
        trace_context: str | None,
    ) -> tuple[set[uuid.UUID], int]:
        """The whole workflow in one statement (``jobs``: row, key, dependency count; none with
        a unique key). Returns the ids inserted (one refused by its idempotency key is
        missing) and how many are PENDING."""
        rows = [j[0] for j in jobs]
        values = insert_arrays(rows) | {
            "workflow_id": workflow_id,
            "name": name,
            "on_failure": on_failure,
            "child": [c for c, _ in edges],
            "parent": [p for _, p in edges],
            "meta": [r.meta_json for r in rows],
            "job_key": [j[1] for j in jobs],
            "deps": [j[2] for j in jobs],
            "trace_context": trace_context,
        }
        with partition_key_checked():
            row = await conn.fetchrow(self.sql[WORKFLOW_INSERT], *bind(WORKFLOW_INSERT, values))
        return set(row["ids"]), int(row["pending"])

    async def workflow_get(self, conn: Connection, workflow_id: uuid.UUID) -> WorkflowRow | None:
        row = await conn.fetchrow(self.sql[WORKFLOW_GET], workflow_id)
        return None if row is None else WorkflowRow(*row.values())

    async def workflow_jobs(self, conn: Connection, workflow_id: uuid.UUID) -> list[WorkflowJob]:
        rows = await conn.fetch(self.sql[WORKFLOW_JOBS], workflow_id)
        return [WorkflowJob(*r.values()) for r in rows]

    async def workflow_parents(
        self, conn: Connection, job_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, dict[str, Parent]]:
        """job id → its dependencies by key (jobs without any are missing)."""
        out: dict[uuid.UUID, dict[str, Parent]] = {}
        for r in await conn.fetch(self.sql[WORKFLOW_PARENTS], list(job_ids)):
            result = None if r["result"] is None else orjson.loads(r["result"])
            out.setdefault(r["job_id"], {})[r["key"]] = Parent(r["status"], result)
        return out

    async def workflow_cancel(self, conn: Connection, workflow_id: uuid.UUID) -> int | None:
        """Cancel the workflow's open jobs (a running one is asked to stop). The number of jobs
        cancelled or asked to stop; None for no such workflow."""
        n = await conn.fetchval(self.sql[WORKFLOW_CANCEL], workflow_id)
        return None if n is None else int(n)

    async def workflow_finish(self, conn: Connection, *, limit: int) -> int:
        """Running workflows with no open job take their final status; returns how many."""
        return affected(await conn.execute(self.sql[WORKFLOW_FINISH], limit))

    async def workflow_reopen(self, conn: Connection) -> int:
        return affected(await conn.execute(self.sql[WORKFLOW_REOPEN]))

    async def workflow_delete_expired(
        self, conn: Connection, *, older_than: float, failed_older_than: float, limit: int
    ) -> int:
        """Delete finished workflows (with their jobs) past retention; returns how many."""
        sql = self.sql[WORKFLOW_DELETE_EXPIRED]
        return affected(await conn.execute(sql, older_than, failed_older_than, limit))
