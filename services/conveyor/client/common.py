"""What both clients share: the job resource as a dataclass, and each operation's request
(a ``Call``, built here once; ``Client`` and ``AsyncClient`` only send it)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

T = TypeVar("T")
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class JobInfo:
    """A job resource (``raw`` holds every field the API sent). A workflow job names its
    ``workflow_id`` and ``depends_on`` (the ids of the jobs it waits for); a plain job has
    None and []."""

    id: uuid.UUID
    type: str
    status: str
    payload: dict[str, Any]
    result: Any
    error: str | None  # the last failure's final line (``last_error``)
    meta: dict[str, Any] | None
    attempts: int
    duplicate: bool | None  # submit answers: a unique job that already existed
    workflow_id: uuid.UUID | None
    depends_on: list[uuid.UUID]
    raw: dict[str, Any]
    partition_key: str | None = None
    waiting_for: str | None = None  # why a WAITING job waits (GET /jobs/{id})
    debounced: bool | None = None  # a debounced submit's answer: folded into a waiting job

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobInfo:
        return cls(
            id=uuid.UUID(d["id"]),
            type=d["type"],
            status=d["status"],
            payload=d["payload"],
            result=d.get("result"),
            error=d.get("last_error"),
            meta=d.get("meta"),
            attempts=d.get("attempts", 0),
            duplicate=d.get("duplicate"),
            workflow_id=uuid.UUID(d["workflow_id"]) if d.get("workflow_id") else None,
            depends_on=[uuid.UUID(i) for i in d.get("depends_on", ())],
            raw=d,
            partition_key=d.get("partition_key"),
            waiting_for=d.get("waiting_for"),
            debounced=d.get("debounced"),
        )


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobInfo]
    next_cursor: str | None


@dataclass(frozen=True)
class WorkflowInfo:
    """A workflow resource: ``jobs`` maps each key to its job (``key``, ``id``, ``type``,
    ``status``, ``after``, ``depends_on``, ``last_error``; empty in list pages), ``counts``
    its jobs by state; ``raw`` holds every field the API sent."""

    id: uuid.UUID
    name: str
    status: str  # RUNNING, COMPLETED, FAILED, CANCELLED
    counts: dict[str, int]
    jobs: dict[str, dict[str, Any]]
    raw: dict[str, Any]

    @property
    def finished(self) -> bool:
        return self.status != "RUNNING"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WorkflowInfo:
        jobs = {j["key"]: j for j in d.get("jobs", ())}
        return cls(uuid.UUID(d["id"]), d["name"], d["status"], d["counts"], jobs, d)


@dataclass(frozen=True)
class WorkflowPage:
    workflows: list[WorkflowInfo]
    next_cursor: str | None


def job_body(
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    priority: int | str | None = None,
    max_retries: int | None = None,
    timeout_seconds: float | None = None,
    run_at: datetime | str | None = None,
    delay_seconds: float | None = None,
    meta: Mapping[str, Any] | None = None,
    unique_for: float | None = None,
    unique_key: str | None = None,
    partition_key: str | None = None,
    debounce_seconds: float | None = None,
    debounce_max_seconds: float | None = None,
    debounce_key: str | None = None,
) -> dict[str, Any]:
    """One job as ``POST /jobs`` takes it (also an item of ``submit_batch``)."""
    body: dict[str, Any] = {"type": job_type, "payload": dict(payload or {})}
    options = {
        "priority": priority,
        "max_retries": max_retries,
        "timeout_seconds": timeout_seconds,
        "run_at": run_at.isoformat() if isinstance(run_at, datetime) else run_at,
        "delay_seconds": delay_seconds,
        "meta": dict(meta) if meta is not None else None,
        "unique_for": unique_for,
        "unique_key": unique_key,
        "partition_key": partition_key,
        "debounce_seconds": debounce_seconds,
        "debounce_max_seconds": debounce_max_seconds,
        "debounce_key": debounce_key,
    }
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def workflow_job(
    key: str,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    after: Iterable[str] = (),
    **options: Any,
) -> dict[str, Any]:
    """One job of ``submit_workflow``: ``job_body``'s fields under ``key``, run once every job
    whose key ``after`` names has completed."""
    return {"key": key, **job_body(job_type, payload, **options), "after": list(after)}


@dataclass(frozen=True)
class Call(Generic[T]):
    """One operation's request (``options``: httpx's ``json``, ``params``, ``headers``), and
    ``read``: its answer's JSON → what the operation returns."""

    method: str
    url: str
    read: Callable[[Any], T]
    options: dict[str, Any] = field(default_factory=dict)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _idem(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key else {}


def submit(
    job_type: str, payload: Mapping[str, Any] | None, key: str | None, options: Mapping[str, Any]
) -> Call[JobInfo]:
    body = job_body(job_type, payload, **options)
    return Call("POST", "/jobs", JobInfo.from_json, {"json": body, "headers": _idem(key)})


def submit_batch(jobs: Iterable[Mapping[str, Any]], key: str | None) -> Call[list[JobInfo]]:
    body = {"jobs": [dict(j) for j in jobs]}
    return Call("POST", "/jobs/batch", _jobs, {"json": body, "headers": _idem(key)})


def get(job_id: uuid.UUID | str) -> Call[JobInfo]:
    return Call("GET", f"/jobs/{job_id}", JobInfo.from_json)


def list_jobs(
    job_type: str | None, status: str | None, limit: int, cursor: str | None
) -> Call[JobPage]:
    params = {"type": job_type, "status": status, "limit": limit, "cursor": cursor}
    return Call(
        "GET", "/jobs", _page, {"params": {k: v for k, v in params.items() if v is not None}}
    )


def act(job_id: uuid.UUID | str, action: str) -> Call[JobInfo]:
    """``cancel`` or ``retry``."""
    return Call("POST", f"/jobs/{job_id}/{action}", JobInfo.from_json)


def _jobs(data: dict[str, Any]) -> list[JobInfo]:
    return [JobInfo.from_json(j) for j in data["jobs"]]


def _page(data: dict[str, Any]) -> JobPage:
    return JobPage(_jobs(data), data.get("next_cursor"))


def submit_workflow(
    name: str, jobs: Iterable[Mapping[str, Any]], on_failure: str, key: str | None
) -> Call[WorkflowInfo]:
    body = {"name": name, "on_failure": on_failure, "jobs": [dict(j) for j in jobs]}
    return Call("POST", "/workflows", WorkflowInfo.from_json, {"json": body, "headers": _idem(key)})


def get_workflow(workflow_id: uuid.UUID | str) -> Call[WorkflowInfo]:
    return Call("GET", f"/workflows/{workflow_id}", WorkflowInfo.from_json)


def list_workflows(
    status: str | None, name: str | None, limit: int, cursor: str | None
) -> Call[WorkflowPage]:
    params = {"status": status, "name": name, "limit": limit, "cursor": cursor}
    return Call(
        "GET",
        "/workflows",
        lambda d: WorkflowPage(
            [WorkflowInfo.from_json(w) for w in d["workflows"]], d.get("next_cursor")
        ),
        {"params": {k: v for k, v in params.items() if v is not None}},
    )


def cancel_workflow(workflow_id: uuid.UUID | str) -> Call[WorkflowInfo]:
    return Call("POST", f"/workflows/{workflow_id}/cancel", WorkflowInfo.from_json)
