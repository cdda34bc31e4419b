"""``GET /types/{type}/partitions`` and ``PUT /types/{type}/partitions/{key}``: the keys of a type
whose jobs go through admission (docs/admission.md), each with its counts, its wait and its
limit, and an operator's settings of one key (its concurrency, its pause), kept until removed.
Scopes as the other ``/types`` routes: reading is ``jobs:read``, a change is ``admin``.

``list_partitions`` and ``set_partition`` are also what ``conveyor types partitions`` and
``conveyor types partition`` run: one home for the paging, the checks and the view of a key
(the counting itself is ``store/sql/types.sql``'s).

A key is a path segment: a client percent-encodes it (``/`` as ``%2F``; the route takes the rest
of the path, so an unencoded ``/`` reaches it too). The keys ``.`` and ``..`` cannot travel as a
segment (HTTP clients resolve them before sending): the route refuses them, and the CLI sets
them."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from ..core.errors import InvalidJob, JobNotFound
from ..core.limits import MAX_CONCURRENCY, check_concurrency
from ..jobs.spec import MAX_PARTITION_KEY, check_partition_key
from ..store import PartitionRow, Store
from ..store.types import UNCHANGED, Unchanged
from .attempts import HasConnection
from .body import BodyError
from .errors import json_response
from .openapi import errors
from .types_routes import TypeName

DEFAULT_PAGE, MAX_PAGE = 100, 1000
# A key as a path segment: no NUL, and not "." or ".." (a client resolves those away)
KEY_PATTERN = r"^(?:[^.\x00][^\x00]*|\.[^.\x00][^\x00]*|\.\.[^\x00]+)$"
# A position in the walk: "<since, in microseconds from the epoch, or n>.<the key in base64url>".
# Every string of this shape decodes to a position (any position is one to start after), as a
# GET /jobs cursor is any 16 bytes: its times stay within years 1653 to 5138, its key within 800
# bytes (a key's most) and of a length base64 allows.
CURSOR_PATTERN = (
    r"^(?:n|[0-9]{1,17}|-[0-9]{1,16})\.(?:[A-Za-z0-9_-]{4}){0,267}(?:[A-Za-z0-9_-]{2,3})?$"
)
_CURSOR = re.compile(CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class PartitionResource(BaseModel):
    """One partition key of a type."""

    key: str = Field(examples=["account-42"])
    waiting: int = Field(description="Its jobs WAITING (for admission, a dependency or run_at).")
    admitted: int = Field(description="Its jobs admitted and not started yet (PENDING).")
    running: int = Field(description="Its jobs IN_PROGRESS.")
    oldest_wait_seconds: float | None = Field(
        description="How long its oldest job that admission could take (due, no dependency "
        "pending) has waited: since its submit, or since its `run_at` (a retry's or a delayed "
        "job's due time) when that is later; null when none waits."
    )
    limit: int | None = Field(
        description="How many of its jobs may be admitted or run at once: the operator's "
        "`concurrency`, else the type's `partition_concurrency`, and 1 for an `ordered` type "
        "whatever they say; null: no limit of its own."
    )
    concurrency: int | None = Field(
        description="The operator's concurrency of this key (PUT); null: the type's applies."
    )
    paused: bool = Field(description="Paused by an operator: none of its jobs is admitted.")


class PartitionPage(BaseModel):
    partitions: list[PartitionResource]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


class PartitionBody(BaseModel):
    """A key's settings; a field left out keeps its value. `{"concurrency": null, "paused":
    false}` removes the override."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CONCURRENCY,
        examples=[1],
        description="At most N of the key's jobs admitted or running at once (null: the type's "
        "`partition_concurrency`).",
    )
    paused: StrictBool = Field(
        default_factory=bool,  # not read when left out (unchanged); null is refused
        description="Admit none of the key's jobs (admitted and running ones go on).",
    )

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value: Any) -> Any:
        """``core.limits.check_concurrency``'s rule (JSON Schema's integer: ``2.0`` is 2)."""
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return check_concurrency(value)


def partition_dict(row: PartitionRow) -> dict[str, Any]:
    return {
        "key": row.key,
        "waiting": row.waiting,
        "admitted": row.admitted,
        "running": row.running,
        "oldest_wait_seconds": row.oldest_wait_seconds,
        "limit": row.limit,
        "concurrency": row.concurrency,
        "paused": row.paused,
    }


def encode_cursor(row: PartitionRow) -> str:
    since = "n" if row.since is None else str((row.since - _EPOCH) // _MICROSECOND)
    key = base64.urlsafe_b64encode(row.key.encode()).decode().rstrip("=")
    return f"{since}.{key}"


def decode_cursor(cursor: str) -> tuple[datetime | None, str]:
    """The position a cursor names (``CURSOR_PATTERN``); ``InvalidJob`` (422) for a string of
    another shape. A key that is not UTF-8 or holds a NUL (a cursor no page gave) is read with
    replacement characters: still a position."""
    if not _CURSOR.fullmatch(cursor):
        raise InvalidJob("invalid cursor")
    since, _, key = cursor.partition(".")
    raw = base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))
    after = raw.decode("utf-8", "replace").replace("\x00", "\ufffd")
    return None if since == "n" else _EPOCH + int(since) * _MICROSECOND, after


async def list_partitions(
    store: Store, conn: Any, job_type: str, limit: int = DEFAULT_PAGE, cursor: str | None = None
) -> dict[str, Any]:
    """A page of ``job_type``'s keys (``PartitionPage``); ``JobNotFound`` for an unknown type,
    ``InvalidJob`` for a bad limit or cursor."""
    if not (isinstance(limit, int) and 1 <= limit <= MAX_PAGE):
        raise InvalidJob(f"limit must be from 1 to {MAX_PAGE}")
    if job_type not in await store.job_type_names(conn):  # before the cursor: 404, not 422
        raise JobNotFound(f"no job type {job_type!r}")
    after = decode_cursor(cursor) if cursor else None
    rows = await store.partition_page(conn, job_type, after=after, limit=limit + 1)
    page, more = rows[:limit], len(rows) > limit
    return {
        "partitions": [partition_dict(r) for r in page],
        "next_cursor": encode_cursor(page[-1]) if more else None,
    }


async def set_partition(
    store: Store,
    conn: Any,
    job_type: str,
    key: str,
    *,
    concurrency: int | Unchanged | None = UNCHANGED,
    paused: bool | None = None,
) -> dict[str, Any]:
    """Change one key's settings (in the caller's transaction) and return its view (nothing
    to change: only read it); ``JobNotFound`` for an unknown type, ``InvalidJob`` /
    ``ValueError`` for a bad key or concurrency."""
    check_partition_key(key)
    if isinstance(concurrency, Unchanged) and paused is None:
        row = await store.partition_get(conn, job_type, key)
    else:
        if not isinstance(concurrency, Unchanged):
            check_concurrency(concurrency)
        row = await store.partition_set(conn, job_type, key, concurrency=concurrency, paused=paused)
    if row is None:
        raise JobNotFound(f"no job type {job_type!r}")
    return partition_dict(row)


Key = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_PARTITION_KEY,
        pattern=KEY_PATTERN,
        description="The partition key, percent-encoded (`/` as `%2F`); not `.` or `..`.",
    ),
]


def add_partition_routes(app: FastAPI, api: HasConnection) -> None:
    @app.get(
        "/types/{name}/partitions",
        response_model=PartitionPage,
        tags=["types"],
        operation_id="list_partitions",
        summary="The partition keys of a job type",
        description="The keys with jobs waiting (WAITING), admitted (PENDING) or running "
        "(IN_PROGRESS), and the keys with an operator's override (so that it can be seen and "
        "removed), each with its counts, the age of its oldest waiting job, its limit and its "
        "pause. Oldest wait first (keys with nothing waiting last), then by key, in keyset "
        "pages: pass `next_cursor` as `cursor`. A type limited as a whole (no partitions) "
        "lists none.",
        responses=errors(404, 422, 503),
    )
    async def list_keys(
        name: TypeName,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Page size.")] = DEFAULT_PAGE,
        cursor: Annotated[
            str | None,
            Query(pattern=CURSOR_PATTERN, description="`next_cursor` of the last page."),
        ] = None,
    ) -> Response:
        async with api.connection() as conn:
            return json_response(await list_partitions(api.store, conn, name, limit, cursor))

    @app.put(
        "/types/{name}/partitions/{key:path}",
        response_model=PartitionResource,
        tags=["types"],
        operation_id="set_partition",
        summary="Change one partition key's concurrency or pause (admin)",
        description="`concurrency`: at most N of the key's jobs admitted or running at once, "
        "instead of the type's `partition_concurrency` (`null`: the type's again); `paused`: "
        "admit none of its jobs (those admitted or running go on). A field left out keeps its "
        'value; the setting is kept, jobs or not, until removed (`{"concurrency": null, '
        '"paused": false}`). The next admission pass applies it. Answers the key\'s view.',
        responses=errors(400, 404, 422, 503),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": PartitionBody.model_json_schema()}},
            }
        },
    )
    async def set_key(name: TypeName, key: Key, request: Request) -> Response:
        try:
            data = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            raise BodyError(400, "malformed_json", "the body is not JSON") from None
        body = PartitionBody.model_validate(data)  # ValidationError: 422 invalid_request
        given = body.model_fields_set
        async with api.connection() as conn, conn.transaction():
            view = await set_partition(
                api.store,
                conn,
                name,
                key,
                concurrency=body.concurrency if "concurrency" in given else UNCHANGED,
                paused=body.paused if "paused" in given else None,
            )
        return json_response(view)
