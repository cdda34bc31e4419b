"""Bodies of ``/schedules``."""

from __future__ import annotations

import uuid
import zoneinfo
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
)

from ..core.jobs import TYPE_PATTERN
from ..jobs.schedules import MAX_EVERY, MIN_EVERY
from .models import _PayloadSchema

_Every = Annotated[float, Strict(), Field(allow_inf_nan=False, ge=MIN_EVERY, le=MAX_EVERY)]


def _numbers(low: int, high: int) -> str:
    """A regex of the integers low..high written without leading zeros."""
    return "(?:" + "|".join(str(n) for n in range(high, low - 1, -1)) + ")"


def _field(low: int, high: int) -> str:
    value = _numbers(low, high)
    item = rf"(?:\*(?:/[1-9][0-9]?)?|{value}(?:/[1-9][0-9]?)?)"
    return rf"{item}(?:,{item})*"


# What the OpenAPI schema states: the common forms (``*``, ``*/15``, ``5``, ``0,30``, ``5/10``)
# with in-range numbers and days of the month up to 28 (so every generated expression matches
# some date). The server accepts more of cron (ranges ``1-5``, names ``MON``/``JAN``, days
# 29-31) and answers 422 ``invalid_schedule`` for what cronsim refuses.
CRON_PATTERN = (
    "^"
    + r"\s+".join([_field(0, 59), _field(0, 23), _field(1, 28), _field(1, 12), _field(0, 7)])
    + "$"
)
ZONES: list[Any] = sorted(z for z in zoneinfo.available_timezones() if z != "localtime")
_Priority = Literal["high", "normal", "low"] | Annotated[StrictInt, Field(ge=0, le=9)]


class ScheduleIn(BaseModel):
    """A schedule: `cron` (5 fields, in `timezone`) or `every_seconds`, not both."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "nightly-report",
                    "type": "report.daily",
                    "cron": "30 2 * * *",
                    "timezone": "Europe/Berlin",
                },
                {"name": "poll", "type": "poll_upstream", "every_seconds": 60},
            ],
            "oneOf": [{"required": ["cron"]}, {"required": ["every_seconds"]}],
        },
    )

    name: StrictStr = Field(pattern=TYPE_PATTERN, description="Unique name; also in the URL.")
    type: StrictStr = Field(pattern=TYPE_PATTERN, description="The job type each tick enqueues.")
    payload: Annotated[dict[str, Any], _PayloadSchema()] = Field(
        default_factory=dict, description="The payload of every job (a JSON object, < 64 KiB)."
    )
    cron: Annotated[
        StrictStr | None, WithJsonSchema({"type": "string", "pattern": CRON_PATTERN})
    ] = Field(
        default=None,
        max_length=200,
        description="Standard 5-field cron: minute hour day-of-month month day-of-week.",
        examples=["*/5 * * * *"],
    )
    every_seconds: Annotated[
        _Every | None,
        WithJsonSchema({"type": "number", "minimum": MIN_EVERY, "maximum": MAX_EVERY}),
    ] = Field(
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
        json_schema_extra={"enum": ZONES},
    )
    priority: _Priority = Field(default="normal", description="Priority of every job.")
    enabled: StrictBool = Field(default=True, description="false: created paused.")
    catch_up: Literal["skip", "last"] = Field(
        default="skip",
        description="Ticks missed while no sweeper ran (older than CONVEYOR_SCHEDULE_GRACE): "
        "`skip` them, or run the `last` one once.",
    )

    @field_validator("priority", mode="before")
    @classmethod
    def _integral(cls, value: Any) -> Any:
        """JSON Schema's integer: ``4.0`` is 4."""
        return int(value) if isinstance(value, float) and value.is_integer() else value

    @field_validator("cron", "every_seconds", mode="before")
    @classmethod
    def _given_not_null(cls, value: Any) -> Any:
        """Give one of cron / every_seconds, or leave it out: an explicit null is refused."""
        if value is None:
            raise ValueError("leave the field out instead of null")
        return value


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
    source: str = Field(
        description="`api` (POST /schedules), `cli` (`conveyor schedules add`) or `code` "
        "(a handler's)."
    )
    next_run_at: datetime | None = Field(description="The next tick; null while paused.")
    last_tick_at: datetime | None
    last_job_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime


class ScheduleList(BaseModel):
    schedules: list[ScheduleResource]
