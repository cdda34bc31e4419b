"""The error body every non-2xx answer has (``errors.py`` builds it; OpenAPI documents it)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..core.jobs import Status


class Problem(BaseModel):
    """One invalid field."""

    loc: list[str | int] = Field(description="Where: `body`, field names and list indexes.")
    msg: str = Field(description="What is wrong.")
    type: str = Field(description="Pydantic's error type.")


class TransitionDetail(BaseModel):
    message: str = Field(description="Why the operation does not apply.")
    status: Status = Field(description="The job's current status.")


class UnknownTypeDetail(BaseModel):
    type: str = Field(description="The type no worker registered.")
    known: list[str] = Field(description="The registered types.")
    message: str = Field(description="The same as a sentence.")


class ErrorBody(BaseModel):
    """Every non-2xx answer has this shape."""

    error: str = Field(
        description="A short code: malformed_json, invalid_request, invalid_number, "
        "nesting_too_deep, too_many_jobs, invalid_job, unknown_job_type, payload_too_large, "
        "body_too_large, "
        "not_found, method_not_allowed, idempotency_conflict, invalid_transition, "
        "service_unavailable.",
        examples=["invalid_request"],
    )
    detail: str | list[Problem] | TransitionDetail | UnknownTypeDetail = Field(
        description="A sentence, the list of invalid fields (422), the job's status (409), or "
        "the unknown type and the known ones (422)."
    )
