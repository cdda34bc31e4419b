"""What both clients share: the job resource as a dataclass, request bodies, error mapping,
the polling backoff of ``wait``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from .errors import _ERRORS, ApiError

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
FIRST_POLL = 0.05
MAX_POLL = 1.0
POLL_GROWTH = 1.5


@dataclass(frozen=True)
class JobInfo:
    """A job resource (``raw`` holds every field the API sent)."""

    id: uuid.UUID
    type: str
    status: str
    payload: dict[str, Any]
    result: Any
    error: str | None  # the last failure's final line (``last_error``)
    meta: dict[str, Any] | None
    attempts: int
    duplicate: bool | None  # submit answers: a unique job that already existed
    raw: dict[str, Any]

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
            raw=d,
        )


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobInfo]
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
    }
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def _check(r: httpx.Response) -> Any:
    if r.status_code < 300:
        return r.json() if r.content else None
    try:
        data = r.json()
        error, detail = data.get("error", "error"), data.get("detail")
    except ValueError:
        error, detail = "error", r.text[:500]
    raise _ERRORS.get(r.status_code, ApiError)(r.status_code, error, detail, r.headers)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _idem(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key else {}


def _list_params(
    job_type: str | None, status: str | None, limit: int, cursor: str | None
) -> dict[str, Any]:
    params = {"type": job_type, "status": status, "limit": limit, "cursor": cursor}
    return {k: v for k, v in params.items() if v is not None}


def _page(data: dict[str, Any]) -> JobPage:
    return JobPage([JobInfo.from_json(j) for j in data["jobs"]], data.get("next_cursor"))


class _Backoff:
    def __init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.delay = FIRST_POLL

    def next_sleep(self) -> float | None:
        """Seconds to sleep before the next poll; None when the time is up."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return None
        sleep = min(self.delay, left)
        self.delay = min(self.delay * POLL_GROWTH, MAX_POLL)
        return sleep
