"""``/schedules``: create or replace, list, read, delete, pause and resume, and their bodies.
Reads need the ``jobs:read`` scope and changes ``admin`` (``auth.ROUTE_SCOPES``)."""

from __future__ import annotations

import uuid
import zoneinfo
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Path, Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    WithJsonSchema,
    field_validator,
)

from ..core.errors import JobNotFound
from ..core.jobs import TYPE_PATTERN
from ..jobs.schedules import MAX_EVERY, MIN_EVERY, build_schedule, resume_at
from ..store.schedules import ScheduleRow
from .attempts import HasConnection
from .errors import json_response
from .models import PayloadSchema, PriorityValue
from .openapi import errors
from .service import Api

Name = Annotated[str, Path(pattern=TYPE_PATTERN, description="The schedule's name.")]
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
    payload: Annotated[dict[str, Any], PayloadSchema()] = Field(
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
    priority: PriorityValue = Field(default="normal", description="Priority of every job.")
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


def schedule_dict(row: ScheduleRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "type": row.job_type,
        "payload": row.payload,
        "cron": row.cron,
        "every_seconds": row.every_seconds,
        "timezone": row.timezone,
        "priority": row.priority,
        "enabled": row.enabled,
        "catch_up": row.catch_up,
        "source": row.source,
        "next_run_at": row.next_run_at,
        "last_tick_at": row.last_tick_at,
        "last_job_id": row.last_job_id,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


async def set_enabled(
    api: HasConnection, conn: Any, row: ScheduleRow, enabled: bool
) -> ScheduleRow | None:
    """Pause, or resume from the next tick on (ticks that fell while paused do not run)."""
    at = resume_at(row, await api.store.db_clock(conn)) if enabled else None
    return await api.store.schedule_set_enabled(conn, row.name, enabled, at)


def add_schedule_routes(app: FastAPI, api: Api) -> None:
    async def one(name: str) -> ScheduleRow:
        async with api.connection() as conn:
            row = await api.store.schedule_get(conn, name)
        if row is None:
            raise JobNotFound(f"no schedule {name}")
        return row

    @app.post(
        "/schedules",
        status_code=201,
        response_model=ScheduleResource,
        operation_id="put_schedule",
        summary="Create or replace a schedule",
        description="201 when created, 200 when a schedule of that name was replaced (its next "
        "tick is kept while the rule is unchanged). Each tick enqueues exactly one job, however "
        "many sweepers run.",
        responses={
            200: {"model": ScheduleResource, "description": "Replaced."},
            **errors(400, 422, 503),
        },
    )
    async def put_schedule(body: ScheduleIn) -> Response:
        async with api.connection() as conn:
            new = build_schedule(
                body.name,
                body.type,
                payload=body.payload,
                cron=body.cron,
                every_seconds=body.every_seconds,
                timezone=body.timezone,
                priority=body.priority,
                enabled=body.enabled,
                catch_up=body.catch_up,
                now=await api.store.db_clock(conn),
            )
            if api.known_types is not None:
                await api.known_types.check(conn, [new.job_type])
            done = await api.store.schedule_upsert(conn, new)
        assert done is not None  # an API upsert always writes
        return json_response(schedule_dict(done[0]), 201 if done[1] else 200)

    @app.get(
        "/schedules",
        response_model=ScheduleList,
        operation_id="list_schedules",
        summary="List schedules",
        description="Every schedule, by name, with its rule, state and next tick.",
        responses=errors(503),
    )
    async def list_schedules() -> Response:
        async with api.connection() as conn:
            rows = await api.store.schedule_list(conn)
        return json_response({"schedules": [schedule_dict(r) for r in rows]})

    @app.get(
        "/schedules/{name}",
        response_model=ScheduleResource,
        operation_id="get_schedule",
        summary="Read a schedule",
        description="The schedule's rule, state, next tick and the last job it enqueued.",
        responses=errors(404, 422, 503),
    )
    async def get_schedule(name: Name) -> Response:
        return json_response(schedule_dict(await one(name)))

    @app.delete(
        "/schedules/{name}",
        status_code=204,
        operation_id="delete_schedule",
        summary="Delete a schedule",
        description="Jobs it already enqueued stay. A handler's schedule comes back at the next "
        "worker start unless its `schedule=` is removed from the code.",
        responses=errors(404, 422, 503),
    )
    async def delete_schedule(name: Name) -> Response:
        async with api.connection() as conn:
            if not await api.store.schedule_delete(conn, name):
                raise JobNotFound(f"no schedule {name}")
        return Response(status_code=204)

    def toggle_route(action: str) -> Any:
        enabled = action == "resume"

        async def toggle(name: Name) -> Response:
            row = await one(name)
            async with api.connection() as conn:
                after = await set_enabled(api, conn, row, enabled)
            if after is None:
                raise JobNotFound(f"no schedule {name}")
            return json_response(schedule_dict(after))

        return toggle

    for action in ("pause", "resume"):
        app.post(
            f"/schedules/{{name}}/{action}",
            response_model=ScheduleResource,
            operation_id=f"{action}_schedule",
            summary=f"{action.capitalize()} a schedule",
            description="Paused: no tick enqueues a job. Resumed: from the next tick on (ticks "
            "that fell while it was paused do not run).",
            responses=errors(404, 422, 503),
        )(toggle_route(action))
