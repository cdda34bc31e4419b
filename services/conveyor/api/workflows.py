"""``/workflows``: submit a DAG of jobs (``conveyor.workflows``) in one transaction, read it,
list them newest first in keyset pages, cancel one; and their bodies. Scopes are the jobs'
(``api/auth.py``): ``jobs:write`` submits and cancels, ``jobs:read`` reads.

A submit is refused whole before anything is written: 422 ``invalid_workflow`` for the graph
(a cycle, an unknown or duplicate key, more jobs than ``CONVEYOR_MAX_WORKFLOW_JOBS``), the
jobs' own 422/413 otherwise, each naming the job's key. An ``Idempotency-Key`` seen before
answers 200 and the first workflow for the same body, 409 for another."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import FastAPI, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from pydantic.config import JsonDict

from ..core.errors import InvalidJob, JobNotFound
from ..core.jobs import Status
from ..jobs.spec import check_horizon, check_replay, request_digest
from ..store.connect import is_unique_violation
from ..store.workflows import WorkflowJob, WorkflowRow
from ..workflows import (
    DEFAULT_MAX_JOBS,
    MAX_KEY_LENGTH,
    Workflow,
    cancel_workflow,
    enqueue_workflow,
    get_workflow,
    levels,
)
from .body import parse_json
from .errors import error_response
from .models import NO_NUL, SubmitJob
from .openapi import AnyCase, PageCursor, PageLimit, errors, json_body, submit_headers
from .resource import decode_cursor, error_summary, keyset_page
from .routes import idempotency_key
from .service import INLINE_PARSE_BYTES, Api

Key = Annotated[StrictStr, Field(min_length=1, max_length=MAX_KEY_LENGTH, pattern=NO_NUL)]
WorkflowStatus = Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED"]

_EXAMPLE: dict[str, Any] = {
    "name": "nightly-report",
    "on_failure": "cancel",
    "jobs": [
        {"key": "fetch", "type": "fetch_data", "payload": {"day": "2026-11-25"}},
        {"key": "part-1", "type": "transform", "payload": {"i": 1}, "after": ["fetch"]},
        {"key": "part-2", "type": "transform", "payload": {"i": 2}, "after": ["fetch"]},
        {"key": "report", "type": "build_report", "after": ["part-1", "part-2"]},
    ],
}


class WorkflowJobIn(SubmitJob):
    """One job of the workflow: a job submit (``POST /jobs``' fields) under a key, after the
    jobs whose keys ``after`` names."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"key": "fetch", "type": "fetch_data", "payload": {"day": "2026-11-25"}}],
            "not": {"required": ["run_at", "delay_seconds"]},
        },
    )

    key: Key = Field(description="Unique in the workflow; `after` names jobs by it.")
    after: list[Key] = Field(
        default_factory=list,
        description="Keys of the jobs this one waits for (each once); it runs when all of them "
        "completed. Empty: it runs at once.",
        examples=[["fetch"]],
    )


class SubmitWorkflow(BaseModel):
    """A DAG of jobs, submitted in one transaction: all or none."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_EXAMPLE]})

    name: Key = Field(description="A name to find it by (not unique).", examples=["nightly"])
    on_failure: Literal["cancel", "continue"] = Field(
        default="cancel",
        description="`cancel`: a failed or cancelled job cancels every job downstream of it. "
        "`continue`: its dependents run anyway.",
    )
    # maxItems documents the default CONVEYOR_MAX_WORKFLOW_JOBS; the configured limit answers
    # 422 invalid_workflow
    jobs: list[WorkflowJobIn] = Field(
        min_length=1,
        description="The jobs, in any order; no cycle (10,000 at most by default).",
        json_schema_extra={"maxItems": DEFAULT_MAX_JOBS},
    )


class WorkflowCounts(BaseModel):
    jobs: int = Field(description="All jobs of the workflow.")
    waiting: int = Field(description="WAITING for a dependency.")
    queued: int = Field(description="PENDING, SCHEDULED or RETRYING.")
    running: int = Field(description="IN_PROGRESS.")
    completed: int
    failed: int
    cancelled: int


class WorkflowJobState(BaseModel):
    key: str = Field(description="The job's key in the workflow.", examples=["report"])
    id: uuid.UUID = Field(description="The job's id (`GET /jobs/{id}`).")
    type: str = Field(examples=["build_report"])
    status: Status
    after: list[str] = Field(description="The keys of the jobs it waits for.")
    depends_on: list[uuid.UUID] = Field(description="Their job ids.")
    last_error: str | None = Field(
        description="The last failure's final line, or why it was cancelled."
    )


class WorkflowSummary(BaseModel):
    """A workflow and how many of its jobs are in each state."""

    id: uuid.UUID = Field(description="The workflow id.")
    name: str = Field(examples=["nightly-report"])
    status: WorkflowStatus = Field(
        description="RUNNING until every job is final; then COMPLETED, FAILED (a job failed) "
        "or CANCELLED (cancelled, or a job was)."
    )
    on_failure: Literal["cancel", "continue"]
    created_at: datetime
    finished_at: datetime | None
    counts: WorkflowCounts


_ID, _JOB = "0193a0c4-1b2c-7d7e-8000-1f6b2e1c4a01", "0193a0c4-1b2c-7d7e-8000-1f6b2e1c4a02"
_RESOURCE: JsonDict = {
    "id": _ID,
    "name": "nightly-report",
    "status": "RUNNING",
    "on_failure": "cancel",
    "created_at": "2026-11-26T02:00:00Z",
    "finished_at": None,
    "counts": {"jobs": 2, "waiting": 1, "queued": 0, "running": 1, "completed": 0,
               "failed": 0, "cancelled": 0},
    "jobs": [
        {"key": "fetch", "id": _JOB, "type": "fetch_data", "status": "IN_PROGRESS",
         "after": [], "depends_on": [], "last_error": None},
        {"key": "report", "id": "0193a0c4-1b2c-7d7e-8000-1f6b2e1c4a03", "type": "build_report",
         "status": "WAITING", "after": ["fetch"], "depends_on": [_JOB], "last_error": None},
    ],
}  # fmt: skip


class WorkflowResource(WorkflowSummary):
    """A workflow with each of its jobs."""

    model_config = ConfigDict(json_schema_extra={"examples": [_RESOURCE]})

    jobs: list[WorkflowJobState] = Field(
        description="Its jobs, each after the jobs it waits for (level by level, by key)."
    )


class WorkflowPage(BaseModel):
    """One page of workflows, newest first."""

    workflows: list[WorkflowSummary] = Field(description="At most `limit` workflows.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


DIFFERENT_WORKFLOW = "this Idempotency-Key was already used with a different workflow"
KEY_INDEX = "workflows_idempotency_key_idx"


class InvalidWorkflow(InvalidJob):
    """The graph itself: a cycle, an unknown or duplicate key, too many jobs (422)."""


def build(raw: bytes, max_payload_bytes: int) -> tuple[SubmitWorkflow, Workflow, Any]:
    """The body read as a batch's is (``parse_json``: ``BodyError``; pydantic's
    ``ValidationError``), the workflow and its validated rows (``Workflow.build``); raises
    ``InvalidWorkflow`` for the graph, ``InvalidJob``/``PayloadTooLarge`` for a job (named by
    its key)."""
    body = SubmitWorkflow.model_validate(parse_json(raw))
    try:
        wf = Workflow(body.name, on_failure=body.on_failure)
        for j in body.jobs:
            wf.add(
                j.key,
                j.type,
                j.payload,
                after=j.after,
                priority=j.priority,
                max_retries=j.max_retries,
                timeout_seconds=j.timeout_seconds,
                run_at=j.run_at,
                delay_seconds=j.delay_seconds,
                **j.options(),
            )
        wf.order()
    except InvalidJob as exc:
        raise InvalidWorkflow(str(exc)) from None
    return body, wf, wf.build(max_payload_bytes)


def counts(row: WorkflowRow) -> dict[str, int]:
    names = ("jobs", "waiting", "queued", "running", "completed", "failed", "cancelled")
    return {n: getattr(row, n) for n in names}


def summary(row: WorkflowRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "status": row.status,
        "on_failure": row.on_failure,
        "created_at": row.created_at,
        "finished_at": row.finished_at,
        "counts": counts(row),
    }


def ordered(jobs: list[WorkflowJob]) -> list[WorkflowJob]:
    """Level by level, each level by key: every job after the jobs it waits for."""
    by_key = {j.key: j for j in jobs}
    return [by_key[k] for level in levels({j.key: j.after for j in jobs}) for k in level]


def workflow_resource(row: WorkflowRow, jobs: list[WorkflowJob]) -> dict[str, Any]:
    jobs = ordered(jobs)
    ids = {j.key: j.id for j in jobs}
    return {
        **summary(row),
        "jobs": [
            {
                "key": j.key,
                "id": j.id,
                "type": j.job_type,
                "status": j.status,
                "after": j.after,
                "depends_on": [ids[k] for k in j.after],
                "last_error": error_summary(j.last_error),
            }
            for j in jobs
        ],
    }


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data, default=str), status, media_type="application/json")


class WorkflowApi:
    """What the routes do, on the API's pool and settings."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def read(self, conn: Any, workflow_id: uuid.UUID) -> dict[str, Any]:
        found = await get_workflow(conn, workflow_id, schema=self.api.store.schema)
        if found is None:
            raise JobNotFound(f"no workflow {workflow_id}")
        return workflow_resource(*found)

    async def replay(self, conn: Any, key: str, digest: str) -> dict[str, Any] | None:
        found = await self.api.store.workflow_by_idempotency_key(conn, key)
        if found is None:
            return None
        check_replay(found[1], digest, DIFFERENT_WORKFLOW)
        return await self.read(conn, found[0])

    async def insert(
        self, conn: Any, wf: Workflow, built: Any, key: str | None, digest: str
    ) -> uuid.UUID:
        """The workflow's rows, and its Idempotency-Key (a second holder of the key violates
        the unique index), in the caller's transaction."""
        workflow_id = await enqueue_workflow(conn, wf, schema=self.api.store.schema, built=built)
        if key is not None:
            await self.api.store.workflow_set_idempotency_key(conn, workflow_id, key, digest)
        return workflow_id

    async def submit(self, raw: bytes, key: str | None) -> tuple[int, Any]:
        api = self.api
        limit = api.settings.max_payload_bytes

        def parse() -> tuple[Workflow, Any, str]:
            body, wf, built = build(raw, limit)
            digest = request_digest(body.model_dump(mode="json")) if key is not None else ""
            return wf, built, digest

        # a large workflow is parsed, validated and hashed in a thread, so the loop keeps
        # serving (as a batch is): 10,000 jobs are about half a second of CPU
        if len(raw) <= INLINE_PARSE_BYTES:
            wf, built, digest = parse()
        else:
            wf, built, digest = await asyncio.to_thread(parse)
        rows = [row for _, row in built[0]]
        async with api.connection() as conn:
            if key is not None and (seen := await self.replay(conn, key, digest)) is not None:
                return 200, seen
            check_horizon(rows, api.settings.max_schedule_days)
            if api.known_types is not None:
                await api.known_types.check(conn, [r.job_type for r in rows])
            # thousands of jobs may take seconds: no command timeout while the server answers
            # probes (``Api.long``, as a batch), in one transaction
            tx = conn.transaction()
            await tx.start()
            try:
                workflow_id = await api.long(conn, lambda c: self.insert(c, wf, built, key, digest))
            except BaseException as exc:
                with contextlib.suppress(Exception):  # the connection may be terminated
                    await tx.rollback()
                # the same key submitted at once: the first commit holds it
                if (
                    is_unique_violation(exc, KEY_INDEX)
                    and key is not None
                    and (seen := await self.replay(conn, key, digest)) is not None
                ):
                    return 200, seen
                raise
            await tx.commit()
            for job_type, n in collections.Counter(r.job_type for r in rows).items():
                api.metrics.jobs_submitted.labels(job_type).inc(n)
            return 201, await api.long(conn, lambda c: self.read(c, workflow_id))

    async def page(
        self, status: str | None, name: str | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        before = decode_cursor(cursor) if cursor else None
        async with self.api.connection() as conn:
            rows = await self.api.store.workflow_page(
                conn, status=status, name=name, before=before, limit=limit + 1
            )
        rows, next_cursor = keyset_page(rows, limit)
        return {"workflows": [summary(r) for r in rows], "next_cursor": next_cursor}

    async def cancel(self, workflow_id: uuid.UUID) -> dict[str, Any]:
        api = self.api
        async with api.connection() as conn:
            try:  # one statement (it locks and cancels every open job): Api.long
                await api.long(
                    conn, lambda c: cancel_workflow(c, workflow_id, schema=api.store.schema)
                )
            except LookupError:
                raise JobNotFound(f"no workflow {workflow_id}") from None
            return await api.long(conn, lambda c: self.read(c, workflow_id))


def add_workflow_routes(app: FastAPI, api: Api) -> None:
    service = WorkflowApi(api)

    @app.exception_handler(InvalidWorkflow)
    async def _invalid(_: Request, exc: InvalidWorkflow) -> Response:
        api.metrics.api_errors.labels("422").inc()
        return error_response(422, "invalid_workflow", str(exc))

    @app.post(
        "/workflows",
        status_code=201,
        response_model=WorkflowResource,
        tags=["workflows"],
        operation_id="submit_workflow",
        summary="Submit a workflow",
        description="Commits every job of the DAG, its dependencies and the workflow in one "
        "transaction: a 201 means the jobs will run, each once the jobs it waits for completed "
        "(jobs with nothing to wait for at once). A cycle, an unknown or duplicate key, too "
        "many jobs (`CONVEYOR_MAX_WORKFLOW_JOBS`, default 10,000) or an invalid job: 422 and "
        "nothing written. With an `Idempotency-Key` seen before and the same body: 200 and the "
        "first workflow.",
        responses={
            200: {"model": WorkflowResource, "description": "Idempotent replay: the workflow."},
            **errors(400, 409, 413, 422, 503),
        },
        openapi_extra=json_body(SubmitWorkflow, "The workflow to submit.", submit_headers()[:1]),
    )
    async def submit_workflow(request: Request) -> Response:
        status, resource = await service.submit(await request.body(), idempotency_key(request))
        return _json(resource, status)

    @app.get(
        "/workflows/{workflow_id:uuid}",
        response_model=WorkflowResource,
        tags=["workflows"],
        operation_id="get_workflow",
        summary="Read a workflow",
        description="Its status, its jobs' counts by state, and each job with its key, id, "
        "type, status and the jobs it waits for (keys and ids).",
        responses=errors(404, 422, 503),
    )
    async def get_workflow_route(workflow_id: uuid.UUID) -> Response:
        async with api.connection() as conn:  # a workflow of thousands of jobs: Api.long
            return _json(await api.long(conn, lambda c: service.read(c, workflow_id)))

    @app.get(
        "/workflows",
        response_model=WorkflowPage,
        tags=["workflows"],
        operation_id="list_workflows",
        summary="List workflows",
        description="Newest first, with their jobs' counts, filtered by status and name, in "
        "keyset pages: pass the answer's `next_cursor` as `cursor` for the next page.",
        responses=errors(422, 503),
    )
    async def list_workflows(
        status: Annotated[
            WorkflowStatus | None,
            AnyCase,
            Query(description="Only workflows in this status (any case)."),
        ] = None,
        name: Annotated[Key | None, Query(description="Only workflows of this name.")] = None,
        limit: PageLimit = 50,
        cursor: PageCursor = None,
    ) -> Response:
        return _json(await service.page(status, name, limit, cursor))

    @app.post(
        "/workflows/{workflow_id:uuid}/cancel",
        response_model=WorkflowResource,
        tags=["workflows"],
        operation_id="cancel_workflow",
        summary="Cancel a workflow",
        description="Cancels every unfinished job (a running one is asked to stop, and its "
        "result is discarded); nothing is released after it. Idempotent: a finished or "
        "cancelled workflow is answered as it is.",
        responses=errors(404, 422, 503),
    )
    async def cancel_workflow_route(workflow_id: uuid.UUID) -> Response:
        return _json(await service.cancel(workflow_id))
