"""``GET /jobs/{id}/attempts``: every attempt of a job, oldest first (SPEC §9)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Protocol

from fastapi import FastAPI
from pydantic import BaseModel

from ..core.errors import JobNotFound
from ..store import AttemptRow, Store


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
    """The API service (``api.service.Api``): a store and a guarded connection."""

    store: Store

    def connection(self) -> Any: ...


def attempt_dict(a: AttemptRow) -> dict[str, Any]:
    return {
        "attempt": a.attempt,
        "worker_id": a.worker_id,
        "started_at": a.started_at,
        "finished_at": a.finished_at,
        "outcome": a.outcome,
        "error": a.error,
        "duration_seconds": a.duration_seconds,
    }


async def list_attempts(api: HasConnection, job_id: uuid.UUID) -> list[AttemptRow]:
    async with api.connection() as conn:
        rows = await api.store.job_attempt_list(conn, job_id)
    if rows is None:
        raise JobNotFound(f"no job {job_id}")
    return rows


def add_attempt_routes(app: FastAPI, api: HasConnection) -> None:
    @app.get("/jobs/{job_id}/attempts", response_model=AttemptList, tags=["jobs"])
    async def job_attempts(job_id: uuid.UUID) -> dict[str, Any]:
        """Every attempt of the job, oldest first; the running one has ``outcome`` null."""
        return {"attempts": [attempt_dict(a) for a in await list_attempts(api, job_id)]}
