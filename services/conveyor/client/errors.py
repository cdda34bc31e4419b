"""The client's typed errors: one class per status the API answers (``ApiError`` for others),
raised by ``check``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from .common import JobInfo, WorkflowInfo


class ApiError(Exception):
    """A non-2xx answer: ``status``, the API's ``error`` code and ``detail``."""

    def __init__(self, status: int, error: str, detail: Any, headers: Mapping[str, str]) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = dict(headers)


class BadRequest(ApiError):
    """400: the body was not JSON."""


class Unauthorized(ApiError):
    """401: no API key, or an unknown one."""


class Forbidden(ApiError):
    """403: the key lacks the scope."""


class NotFound(ApiError):
    """404: no such job (or schedule)."""


class Conflict(ApiError):
    """409: an Idempotency-Key reused with another body, or a cancel/retry the status forbids."""


class PayloadTooLarge(ApiError):
    """413."""


class InvalidRequest(ApiError):
    """422: invalid fields, unknown job type, bad numbers, too many jobs."""


class RateLimited(ApiError):
    """429: over the key's quota; ``retry_after`` seconds (from ``Retry-After``) or None."""

    @property
    def retry_after(self) -> float | None:
        try:
            return float(self.headers.get("retry-after", ""))
        except ValueError:
            return None


class Unavailable(ApiError):
    """503: PostgreSQL unreachable or not migrated; safe to retry (with an Idempotency-Key)."""


class WaitTimeout(TimeoutError):
    """``wait`` (``wait_workflow``) ran out of time; ``job`` is the job (the workflow) as last
    seen."""

    def __init__(self, job: JobInfo | WorkflowInfo, timeout: float) -> None:
        what = "job" if hasattr(job, "type") else "workflow"
        super().__init__(f"{what} {job.id} is {job.status} after {timeout} s")
        self.job = job


_ERRORS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
}


def check(r: httpx.Response) -> Any:
    """The answer's JSON (None when empty), or the typed error of a non-2xx answer."""
    if r.status_code < 300:
        return r.json() if r.content else None
    try:
        data = r.json()
        error, detail = data.get("error", "error"), data.get("detail")
    except ValueError:
        error, detail = "error", r.text[:500]
    raise _ERRORS.get(r.status_code, ApiError)(r.status_code, error, detail, r.headers)
