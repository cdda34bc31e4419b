"""``GET /jobs/{id}/attempts``: every attempt of a job, oldest first."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Protocol

from fastapi import FastAPI, Response
from pydantic import BaseModel

from ..core.config import Settings
from ..core.errors import JobNotFound
from ..store import AttemptRow, Store
from .auth import full_errors
from .errors import json_response
from .openapi import errors
from .resource import error_summary


class AttemptResource(BaseModel):
    attempt: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str | None  # completed|retry|failed|cancelled|released|lease_expired; null: running
    error: str | None
    duration_seconds: float | None


class AttemptList(BaseModel):
    attempts: list[AttemptResource]


class HasConnection(Protocol):
    """The API service (``api.service.Api``): settings, a store and a guarded connection."""

    settings: Settings
    store: Store

    def connection(self) -> Any: ...


def attempt_dict(a: AttemptRow, *, tracebacks: bool = True) -> dict[str, Any]:
    """``tracebacks=False``: ``error`` reduced to its last line."""
    return {
        "attempt": a.attempt,
        "worker_id": a.worker_id,
        "started_at": a.started_at,
        "finished_at": a.finished_at,
        "outcome": a.outcome,
        "error": a.error if tracebacks else error_summary(a.error),
        "duration_seconds": a.duration_seconds,
    }


async def list_attempts(api: HasConnection, job_id: uuid.UUID) -> list[AttemptRow]:
    async with api.connection() as conn:
        rows = await api.store.job_attempt_list(conn, job_id)
    if rows is None:
        raise JobNotFound(f"no job {job_id}")
    return rows


def add_attempt_routes(app: FastAPI, api: HasConnection) -> None:
    @app.get(
        "/jobs/{job_id:uuid}/attempts",
        response_model=AttemptList,
        tags=["jobs"],
        operation_id="list_attempts",
        summary="A job's attempts",
        description="Every attempt of the job, oldest first; the running one has `outcome` null. "
        "`error` is the failure's last line unless the server exposes tracebacks.",
        responses=errors(404, 422, 503),
    )
    async def job_attempts(job_id: uuid.UUID) -> Response:
        """Every attempt of the job, oldest first; the running one has ``outcome`` null. Times
        as the job resource writes them (orjson: ``+00:00``)."""
        rows = await list_attempts(api, job_id)
        data = {"attempts": [attempt_dict(a, tracebacks=full_errors(api.settings)) for a in rows]}
        return json_response(data)
