"""Request and response bodies of the REST API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictInt, model_validator

from ..core.jobs import TYPE_PATTERN, Status
from ..enqueue import JobSpec

PriorityName = Literal["high", "normal", "low"]
PriorityValue = PriorityName | Annotated[StrictInt, Field(ge=0, le=9)]


class SubmitJob(BaseModel):
    """One job to submit."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(pattern=TYPE_PATTERN, description="Job type: also the routing key")
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: PriorityValue = "normal"
    max_retries: int | None = Field(default=None, ge=0, le=1000)
    timeout_seconds: float | None = Field(default=None, gt=0, le=7 * 86400)
    run_at: AwareDatetime | None = None
    delay_seconds: float | None = Field(default=None, ge=0, le=10 * 365 * 86400)

    @model_validator(mode="after")
    def _one_schedule(self) -> SubmitJob:
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        return self

    def to_spec(self, idempotency_key: str | None = None) -> JobSpec:
        return JobSpec(
            type=self.type,
            payload=self.payload,
            priority=self.priority,
            max_retries=self.max_retries,
            timeout_seconds=self.timeout_seconds,
            run_at=self.run_at,
            delay_seconds=self.delay_seconds,
            idempotency_key=idempotency_key,
        )


class SubmitBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[SubmitJob] = Field(min_length=1)


class JobResource(BaseModel):
    id: uuid.UUID
    type: str
    status: Status
    priority: int
    payload: dict[str, Any]
    result: Any = None
    attempts: int
    retry_count: int
    max_retries: int | None
    timeout_seconds: float | None
    last_error: str | None
    cancel_requested: bool
    run_at: datetime | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> JobResource:
        return cls(
            id=row.id,
            type=row.job_type,
            status=Status(row.status),
            priority=row.priority,
            payload=row.payload,
            result=row.result,
            attempts=row.attempts,
            retry_count=row.retry_count,
            max_retries=row.max_retries,
            timeout_seconds=row.timeout_seconds,
            last_error=row.last_error,
            cancel_requested=row.cancel_requested,
            run_at=row.run_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
        )


class BatchResource(BaseModel):
    jobs: list[JobResource]


class JobPage(BaseModel):
    jobs: list[JobResource]
    next_cursor: str | None


class ErrorBody(BaseModel):
    error: str
    detail: Any = None
