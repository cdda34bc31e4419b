"""The HTTP routes: thin, each one calls ``Api`` and answers ready JSON. ``response_model`` and
``responses`` document the answers in OpenAPI without a second validation."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..core.jobs import TYPE_PATTERN, Status
from ..core.metrics import Metrics
from .errors import error_response, json_response
from .models import BatchResource, JobPage, JobResource, SubmitBatch, SubmitJob
from .openapi import AnyCase, PageCursor, PageLimit, errors, json_body, submit_headers
from .service import Api

# The submit routes read their headers themselves (a FastAPI ``Header`` parameter costs a
# dependency-solving pass per request); ``openapi.submit_headers`` declares them.
IDEMPOTENCY_KEY_MAX = 255


def idempotency_key(request: Request) -> str | None:
    """The ``Idempotency-Key`` header, 1-255 characters (a 422 naming the header otherwise)."""
    key = request.headers.get("idempotency-key")
    if key is not None and not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX:
        short = not key
        raise RequestValidationError(
            [
                {
                    "loc": ("header", "idempotency-key"),
                    "type": "string_too_short" if short else "string_too_long",
                    "msg": "String should have at least 1 character"
                    if short
                    else f"String should have at most {IDEMPOTENCY_KEY_MAX} characters",
                }
            ]
        )
    return key


def add_routes(
    r: FastAPI,
    api: Api,
    metrics: Metrics,
    duties: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Routes on the app itself (not an included router), so ``errors.allowed_methods`` sees
    every one of them. ``duties``: the details of the relay and duties the process runs (or
    only watches), for ``/healthz``."""

    @r.post(
        "/jobs",
        status_code=201,
        response_model=JobResource,
        operation_id="submit_job",
        summary="Submit one job",
        description="Commits the job (and its outbox row) in one statement: a 201 means the job "
        "will run. With an `Idempotency-Key` seen before and the same body: 200 and the first "
        "job.",
        responses={
            200: {"model": JobResource, "description": "Idempotent replay: the existing job."},
            **errors(400, 409, 413, 422, 503),
        },
        openapi_extra=json_body(SubmitJob, "The job to submit.", submit_headers()),
    )
    async def submit_job(request: Request) -> Response:
        status, resource = await api.submit(
            await request.body(), idempotency_key(request), request.headers.get("traceparent")
        )
        return json_response(resource, status)

    @r.post(
        "/jobs/batch",
        status_code=201,
        response_model=BatchResource,
        operation_id="submit_batch",
        summary="Submit up to 1,000 jobs at once",
        description="One transaction: all jobs or none, answered in the order given. Limits: "
        "1,000 jobs and a 64 MiB body (configurable); an oversized batch is refused before its "
        "jobs are validated. With an `Idempotency-Key` seen before and the same body: 200 and "
        "the first answer's jobs.",
        responses={
            200: {"model": BatchResource, "description": "Idempotent replay: the existing jobs."},
            **errors(400, 409, 413, 422, 503),
        },
        openapi_extra=json_body(SubmitBatch, "The jobs to submit.", submit_headers()),
    )
    async def submit_batch(request: Request) -> Response:
        status, batch = await api.submit_batch(
            await request.body(), idempotency_key(request), request.headers.get("traceparent")
        )
        return json_response(batch, status)

    @r.get(
        "/jobs/{job_id:uuid}",
        response_model=JobResource,
        operation_id="get_job",
        summary="Read one job",
        description="The job's state, attempts, result and last error.",
        responses=errors(404, 422, 503),
    )
    async def get_job(job_id: uuid.UUID) -> Response:
        return json_response(await api.get(job_id))

    @r.get(
        "/jobs",
        response_model=JobPage,
        operation_id="list_jobs",
        summary="List jobs",
        description="Newest first, filtered by type and status, in keyset pages: pass the "
        "answer's `next_cursor` as `cursor` for the next page.",
        responses=errors(422, 503),
    )
    async def list_jobs(
        type: Annotated[
            str | None, Query(pattern=TYPE_PATTERN, description="Only jobs of this type.")
        ] = None,
        status: Annotated[
            Status | None, AnyCase, Query(description="Only jobs in this status (any case).")
        ] = None,
        limit: PageLimit = 50,
        cursor: PageCursor = None,
    ) -> Response:
        return json_response(await api.list(type, status, limit, cursor))

    @r.post(
        "/jobs/{job_id:uuid}/cancel",
        response_model=JobResource,
        operation_id="cancel_job",
        summary="Cancel a job",
        description="PENDING, SCHEDULED and RETRYING jobs are cancelled at once; a running job "
        "is asked to stop (`cancel_requested`). Other statuses: 409.",
        responses=errors(404, 409, 422, 503),
    )
    async def cancel_job(job_id: uuid.UUID) -> Response:
        return json_response(await api.cancel(job_id))

    @r.post(
        "/jobs/{job_id:uuid}/retry",
        response_model=JobResource,
        operation_id="retry_job",
        summary="Retry a failed or cancelled job",
        description="Puts a FAILED or CANCELLED job back to PENDING (a redrive of one dead "
        "letter). Other statuses: 409.",
        responses=errors(404, 409, 422, 503),
    )
    async def retry_job(job_id: uuid.UUID) -> Response:
        return json_response(await api.retry(job_id))

    @r.get(
        "/healthz",
        operation_id="healthz",
        summary="Liveness",
        description="Answers while the process serves requests; never touches the database. "
        "`duties`: the relay and maintenance duties this process runs (`state`: `off` under "
        "`CONVEYOR_RUN_DUTIES=false`) and what its outbox watch last saw (`outbox.unrelayed`: "
        "rows older than `CONVEYOR_OUTBOX_STALE_AFTER` and no relay connected); a report, never "
        "a failure of this probe.",
    )
    async def healthz() -> dict[str, Any]:
        if duties is None:
            return {"status": "ok"}
        return {"status": "ok", "duties": duties()}

    @r.get(
        "/readyz",
        operation_id="readyz",
        summary="Readiness",
        description="200 when PostgreSQL answers and its schema is at the migration head, else "
        "503 (within 2 s) saying which.",
        responses=errors(503),
    )
    async def readyz() -> Response:
        problem = await api.ready()
        if problem is None:
            return JSONResponse({"status": "ready"})
        metrics.api_errors.labels("503").inc()
        return error_response(503, "service_unavailable", problem)

    @r.get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics",
        description="The API process's metrics in the Prometheus text format.",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    )
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
