"""``GET /types``, ``POST /types/{type}/pause|resume``, ``PUT /types/{type}/limits``: the
known job types, their fleet-wide limits, partition settings and pause flag (a type's keys:
``partitions.py``). Scopes: reading is ``jobs:read``, every change is ``admin``. Workers apply a
change within ``CONVEYOR_TYPE_REFRESH_INTERVAL`` (2 s)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from ..core.errors import InvalidJob, JobNotFound
from ..core.jobs import TYPE_PATTERN
from ..core.limits import MAX_CONCURRENCY, Partitioning, Rate, parse_rate
from ..store import JobType
from .attempts import HasConnection
from .body import BodyError
from .errors import json_response
from .openapi import errors

# what ``core.limits.parse_rate`` accepts, as the schema states it
RATE_PATTERN = r"^[1-9][0-9]{0,4}/([1-9][0-9]{0,2})?[smhd]$"


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
    partition_by: list[str] | None = Field(
        description="The payload fields its jobs' partition keys are made of (joined by `/`); "
        "null: keys come from the submit's `partition_key` only.",
        examples=[["account"]],
    )
    partition_concurrency: int | None = Field(
        description="At most N jobs of one key admitted or running at once (an operator may set "
        "another per key: `PUT /types/{type}/partitions/{key}`)."
    )
    partition_rate_limit: str | None = Field(
        description="At most N starts of one key per window.", examples=["10/m"]
    )
    ordered: str | None = Field(
        description="The jobs of one key run one at a time in the order their submits "
        "committed: `hold` (a FAILED job holds its key until retried or cancelled) or "
        "`continue` (the next goes on); null: not ordered."
    )
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


TypeName = Annotated[str, Path(pattern=TYPE_PATTERN, description="The job type.")]


def type_dict(t: JobType) -> dict[str, Any]:
    rate = Rate(t.rate_limit, t.rate_period) if t.rate_limit and t.rate_period else None
    p = t.partition or Partitioning()
    key_rate = Rate(p.rate_limit, p.rate_period) if p.rate_limit and p.rate_period else None
    return {
        "name": t.name,
        "max_retries": t.max_retries,
        "timeout_seconds": t.timeout_seconds,
        "retry_delays": list(t.retry_delays),
        "paused": t.paused,
        "concurrency": t.concurrency,
        "rate_limit": None if rate is None else str(rate),
        "limits_source": "handler" if t.limits_set_at is None else "operator",
        "running": t.running,
        "partition_by": None if p.by is None else list(p.by),
        "partition_concurrency": p.concurrency,
        "partition_rate_limit": None if key_rate is None else str(key_rate),
        "ordered": p.ordered,
        "first_seen": t.first_seen,
        "last_seen": t.last_seen,
    }


async def _one(api: HasConnection, conn: Any, name: str) -> dict[str, Any]:
    for t in await api.store.job_type_list(conn):
        if t.name == name:
            return type_dict(t)
    raise JobNotFound(f"no job type {name!r}")


def add_type_routes(app: FastAPI, api: HasConnection) -> None:
    @app.get(
        "/types",
        response_model=TypeList,
        tags=["types"],
        operation_id="list_types",
        summary="Known job types",
        description="Every registered type with its handler's defaults, its fleet-wide limits "
        "(`concurrency`, `rate_limit`), its partition settings (`partition_by`, "
        "`partition_concurrency`, `partition_rate_limit`, `ordered`), whether it is paused, and "
        "its running jobs.",
        responses=errors(503),
    )
    async def list_types() -> Response:
        async with api.connection() as conn:
            return json_response(
                {"types": [type_dict(t) for t in await api.store.job_type_list(conn)]}
            )

    async def set_paused(name: str, paused: bool) -> dict[str, Any]:
        async with api.connection() as conn:
            if not await api.store.type_set_paused(conn, name, paused):
                raise JobNotFound(f"no job type {name!r}")
            return await _one(api, conn, name)

    @app.post(
        "/types/{name}/pause",
        response_model=TypeResource,
        tags=["types"],
        operation_id="pause_type",
        summary="Pause a job type (admin)",
        description="Fleet-wide: its jobs are still accepted and wait in its queue (PENDING); "
        "workers stop consuming it within a few seconds. Running jobs finish.",
        responses=errors(404, 422, 503),
    )
    async def pause(name: TypeName) -> Response:
        return json_response(await set_paused(name, True))

    @app.post(
        "/types/{name}/resume",
        response_model=TypeResource,
        tags=["types"],
        operation_id="resume_type",
        summary="Resume a paused job type (admin)",
        description="Workers consume its queue again; the waiting jobs run.",
        responses=errors(404, 422, 503),
    )
    async def resume(name: TypeName) -> Response:
        return json_response(await set_paused(name, False))

    @app.put(
        "/types/{name}/limits",
        response_model=TypeResource,
        tags=["types"],
        operation_id="set_type_limits",
        summary="Change a job type's fleet-wide limits (admin)",
        description="`concurrency`: at most N IN_PROGRESS across all workers; `rate_limit`: at "
        "most N starts per window (`100/m`). A field left out keeps its value; `null` removes "
        "the limit. From then on, workers registering the type keep these limits instead of "
        "their handler's.",
        responses=errors(400, 404, 422, 503),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": LimitsBody.model_json_schema()}},
            }
        },
    )
    async def set_limits(name: TypeName, request: Request) -> Response:
        try:
            data = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            raise BodyError(400, "malformed_json", "the body is not JSON") from None
        body = LimitsBody.model_validate(data)  # ValidationError: 422 invalid_request
        rate: Rate | None = None
        if body.rate_limit is not None:
            try:
                rate = parse_rate(body.rate_limit)
            except ValueError as exc:
                raise InvalidJob(str(exc)) from None
        async with api.connection() as conn, conn.transaction():
            current = await _one(api, conn, name)
            given = body.model_fields_set
            concurrency = body.concurrency if "concurrency" in given else current["concurrency"]
            if "rate_limit" not in given and current["rate_limit"] is not None:
                rate = parse_rate(current["rate_limit"])
            await api.store.type_set_limits(
                conn,
                name,
                concurrency=concurrency,
                rate_limit=rate.limit if rate else None,
                rate_period=rate.period if rate else None,
            )
            return json_response(await _one(api, conn, name))
