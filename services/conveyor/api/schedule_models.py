"""Bodies of ``/schedules`` (SPEC §10)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr

from ..core.jobs import TYPE_PATTERN
from ..schedule_ops import NAME_PATTERN
from ..schedules import MAX_EVERY, MIN_EVERY

_Every = Annotated[float, Strict(), Field(allow_inf_nan=False, ge=MIN_EVERY, le=MAX_EVERY)]
_Priority = Literal["high", "normal", "low"] | Annotated[StrictInt, Field(ge=0, le=9)]


class ScheduleIn(BaseModel):
    """A schedule: `cron` (5 fields, in `timezone`) or `every_seconds`, not both."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "nightly-report", "type": "report.daily", "cron": "30 2 * * *",
                 "timezone": "Europe/Berlin"},
                {"name": "poll", "type": "poll_upstream", "every_seconds": 60},
            ]
        },
    )  # fmt: skip

    name: StrictStr = Field(pattern=NAME_PATTERN, description="Unique name; also in the URL.")
    type: StrictStr = Field(pattern=TYPE_PATTERN, description="The job type each tick enqueues.")
    payload: dict[str, Any] = Field(
        default_factory=dict, description="The payload of every job (a JSON object, < 64 KiB)."
    )
    cron: StrictStr | None = Field(
        default=None,
        max_length=200,
        description="Standard 5-field cron: minute hour day-of-month month day-of-week.",
        examples=["*/5 * * * *"],
    )
    every_seconds: _Every | None = Field(
        default=None,
        description="Instead of cron: a tick every N seconds (1 to a year), aligned to the Unix "
        "epoch.",
    )
    timezone: StrictStr = Field(
        default="UTC",
        max_length=64,
        description="IANA time zone of `cron` (DST: a time in the skipped hour runs once, "
        "right after the change; a fixed time in the repeated hour runs once).",
        examples=["America/New_York"],
    )
    priority: _Priority = Field(default="normal", description="Priority of every job.")
    enabled: StrictBool = Field(default=True, description="false: created paused.")
    catch_up: Literal["skip", "last"] = Field(
        default="skip",
        description="Ticks missed while no sweeper ran (older than CONVEYOR_SCHEDULE_GRACE): "
        "`skip` them, or run the `last` one once.",
    )


class ScheduleResource(BaseModel):
    name: str
    type: str
    payload: dict[str, Any]
    cron: str | None
    every_seconds: float | None
    timezone: str
    priority: int
    enabled: bool
    catch_up: str
    source: str = Field(description="`api` (POST /schedules, CLI) or `code` (a handler's).")
    next_run_at: datetime | None = Field(description="The next tick; null while paused.")
    last_tick_at: datetime | None
    last_job_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime


class ScheduleList(BaseModel):
    schedules: list[ScheduleResource]
