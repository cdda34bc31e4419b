"""Bodies of the job-type routes (``GET /types``, pause/resume, limits) and the job's
``progress``, documented for OpenAPI."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from ..core.limits import MAX_CONCURRENCY

# what ``core.limits.parse_rate`` accepts, as the schema states it
RATE_PATTERN = r"^[1-9][0-9]{0,4}/([1-9][0-9]{0,2})?[smhd]$"


class Progress(BaseModel):
    """The running (or last) attempt's report: ``job.set_progress(percent, message)``."""

    percent: float = Field(description="0-100.", examples=[42.5])
    message: str | None = Field(default=None, description="The handler's message, if any.")
    updated_at: datetime = Field(description="When the worker wrote it (database clock).")


class TypeResource(BaseModel):
    """A known job type: its handler's defaults, its fleet-wide limits and whether it is
    paused."""

    name: str = Field(examples=["send_email"])
    max_retries: int | None = Field(description="The handler's default retries.")
    timeout_seconds: float | None = Field(description="The handler's default timeout.")
    retry_delays: list[int] = Field(description="The handler's retry delays (seconds).")
    paused: bool = Field(description="Paused: jobs are accepted and wait (not started).")
    concurrency: int | None = Field(description="At most this many IN_PROGRESS, all workers.")
    rate_limit: str | None = Field(
        description="At most N starts per window, all workers.", examples=["100/m"]
    )
    limits_source: str = Field(
        description="`handler` (declared on the handler) or `operator` "
        "(set at run time; registering workers keep it)."
    )
    running: int = Field(description="Jobs IN_PROGRESS now.")
    first_seen: datetime
    last_seen: datetime


class TypeList(BaseModel):
    types: list[TypeResource]


class LimitsBody(BaseModel):
    """New limits; a field left out keeps its value, `null` removes the limit."""

    model_config = ConfigDict(extra="forbid")

    concurrency: StrictInt | None = Field(default=None, ge=1, le=MAX_CONCURRENCY, examples=[5])
    rate_limit: StrictStr | None = Field(
        default=None,
        examples=["100/m"],
        pattern=RATE_PATTERN,
        description="N/s, N/m, N/h, N/d or N/<k>s",
    )

    @model_validator(mode="before")
    @classmethod
    def _integral(cls, data: Any) -> Any:
        """JSON Schema's integer: ``2.0`` is 2 (``true`` is not)."""
        c = data.get("concurrency") if isinstance(data, dict) else None
        if isinstance(c, float) and c.is_integer():
            return {**data, "concurrency": int(c)}
        return data
