"""``/schedules``: create or replace, list, read, delete, pause and resume. Reads need the
``jobs:read`` scope and changes ``admin``: the auth layer passes its
dependencies as ``read`` / ``admin``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Path, Request, Response
from fastapi.params import Depends

from ..core.errors import JobNotFound
from ..core.jobs import TYPE_PATTERN
from ..jobs.schedules import InvalidSchedule, build_schedule, resume_at
from ..store.schedules import ScheduleRow
from .errors import error_response
from .openapi import errors
from .schedule_models import ScheduleIn, ScheduleList, ScheduleResource
from .service import Api

Name = Annotated[str, Path(pattern=TYPE_PATTERN, description="The schedule's name.")]


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


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data, default=str), status, media_type="application/json")


def add_schedule_routes(
    app: FastAPI, api: Api, *, read: Sequence[Depends] = (), admin: Sequence[Depends] = ()
) -> None:
    @app.exception_handler(InvalidSchedule)
    async def _invalid(_: Request, exc: InvalidSchedule) -> Response:
        api.metrics.api_errors.labels("422").inc()
        return error_response(422, "invalid_schedule", str(exc))

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
            **errors(422, 503),
        },
        dependencies=list(admin),
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
        return _json(schedule_dict(done[0]), 201 if done[1] else 200)

    @app.get(
        "/schedules",
        response_model=ScheduleList,
        operation_id="list_schedules",
        summary="List schedules",
        description="Every schedule, by name, with its rule, state and next tick.",
        responses=errors(503),
        dependencies=list(read),
    )
    async def list_schedules() -> Response:
        async with api.connection() as conn:
            rows = await api.store.schedule_list(conn)
        return _json({"schedules": [schedule_dict(r) for r in rows]})

    @app.get(
        "/schedules/{name}",
        response_model=ScheduleResource,
        operation_id="get_schedule",
        summary="Read a schedule",
        description="The schedule's rule, state, next tick and the last job it enqueued.",
        responses=errors(404, 422, 503),
        dependencies=list(read),
    )
    async def get_schedule(name: Name) -> Response:
        return _json(schedule_dict(await one(name)))

    @app.delete(
        "/schedules/{name}",
        status_code=204,
        operation_id="delete_schedule",
        summary="Delete a schedule",
        description="Jobs it already enqueued stay. A handler's schedule comes back at the next "
        "worker start unless its `schedule=` is removed from the code.",
        responses=errors(404, 422, 503),
        dependencies=list(admin),
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
                after = await api.store.schedule_set_enabled(
                    conn,
                    name,
                    enabled,
                    resume_at(row, await api.store.db_clock(conn)) if enabled else None,
                )
            if after is None:
                raise JobNotFound(f"no schedule {name}")
            return _json(schedule_dict(after))

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
            dependencies=list(admin),
        )(toggle_route(action))
