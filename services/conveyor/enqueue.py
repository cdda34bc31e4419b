"""Transactional enqueue: a job row and its outbox row written on the caller's connection, inside
the caller's transaction. Works with an asyncpg connection or a SQLAlchemy ``AsyncSession`` /
``AsyncConnection`` on the asyncpg driver."""

from __future__ import annotations

import hashlib
import math
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson

from .core import tracing
from .core.errors import IdempotencyConflict, InvalidJob, PayloadTooLarge
from .core.finite import check_finite
from .core.jobs import check_type, new_job_id, parse_priority
from .job_options import encode_meta, hash_extras, unique_key_for
from .job_types import check_for_enqueue
from .store import NewJob, Store, for_schema
from .store.schema import DEFAULT_SCHEMA

DEFAULT_MAX_PAYLOAD = 256 * 1024
MAX_DELAY_SECONDS = 10 * 365 * 86400
MIN_TIMEOUT_SECONDS = 0.001
MAX_TIMEOUT_SECONDS = 7 * 86400

# A real NUL in a string or key, as orjson writes it: ``\u0000`` preceded by an even number of
# backslashes (the text ``\\u0000``, a backslash then "u0000", is not a NUL and is allowed).
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# asyncpg writes these two instants as PostgreSQL's -infinity / infinity
_DATETIME_SENTINELS = (datetime.min, datetime.max)


def check_run_at(run_at: datetime) -> datetime:
    """``run_at`` must carry an offset and fall strictly inside years 1-9999 in UTC."""
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidJob("run_at must carry a timezone (ISO 8601 with an offset or Z)")
    try:
        utc = run_at.astimezone(UTC)
    except OverflowError:
        raise InvalidJob("run_at must fall inside years 1-9999 in UTC") from None
    if utc.replace(tzinfo=None) in _DATETIME_SENTINELS:
        raise InvalidJob("run_at must fall strictly inside years 1-9999 in UTC")
    return run_at


# orjson writes floats of 1e16 and above with an exponent ("4.324448394381094e+16"); jsonb keeps
# the number but prints it as an integer, which a reader parses as a different (int) value.
_POSITIVE_EXPONENT = re.compile(rb"[0-9]e\+")


def _plain_floats(value: Any) -> Any:
    """``value`` with every float of 1e16 and above as a fixed-point fragment ending in ``.0``:
    jsonb keeps that scale, so the number reads back as the same float."""
    if isinstance(value, float):
        if math.isfinite(value) and abs(value) >= 1e16:
            return orjson.Fragment(f"{Decimal(repr(value)):f}.0".encode())
        return value
    if isinstance(value, Mapping):
        return {k: _plain_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_floats(v) for v in value]
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class JobSpec:
    """What a caller gives for one job (the REST submit body maps onto this)."""

    type: str
    payload: Mapping[str, Any] | None = None
    priority: int | str | None = None
    max_retries: int | None = None
    timeout_seconds: float | None = None
    run_at: datetime | None = None
    delay_seconds: float | None = None
    idempotency_key: str | None = None
    meta: Mapping[str, Any] | None = None  # job_options: ≤ 8 KiB, handed to handlers
    unique_for: float | None = None  # seconds a second submit returns this job
    unique_key: str | None = None  # default: type + canonical payload


def build_job(
    spec: JobSpec,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
    request_hash: str | None = None,
) -> NewJob:
    """Validate ``spec`` and turn it into a row. Raises ``InvalidJob`` / ``PayloadTooLarge``."""
    check_type(spec.type)
    payload = {} if spec.payload is None else spec.payload
    if not isinstance(payload, Mapping):
        raise InvalidJob("payload must be a JSON object")
    try:
        payload_json = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
        if _POSITIVE_EXPONENT.search(payload_json):
            payload_json = orjson.dumps(_plain_floats(payload), option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
    if (where := check_finite(payload, payload_json, "payload")) is not None:
        raise InvalidJob(where)
    if _NUL.search(payload_json):
        raise InvalidJob("payload must not contain NUL characters (PostgreSQL jsonb rejects them)")
    if len(payload_json) > max_payload_bytes:
        raise PayloadTooLarge(
            f"payload is {len(payload_json)} bytes of UTF-8; the limit is {max_payload_bytes}"
        )
    if spec.max_retries is not None and not (
        isinstance(spec.max_retries, int)
        and not isinstance(spec.max_retries, bool)
        and 0 <= spec.max_retries <= 1000
    ):
        raise InvalidJob("max_retries must be an integer between 0 and 1000")
    if spec.timeout_seconds is not None and not (
        _is_number(spec.timeout_seconds)
        and math.isfinite(spec.timeout_seconds)
        and MIN_TIMEOUT_SECONDS <= spec.timeout_seconds <= MAX_TIMEOUT_SECONDS
    ):
        raise InvalidJob("timeout_seconds must be a number from 0.001 to 604800 (a week)")
    if spec.run_at is not None and spec.delay_seconds is not None:
        raise InvalidJob("give run_at or delay_seconds, not both")
    if spec.run_at is not None:
        if not isinstance(spec.run_at, datetime):
            raise InvalidJob("run_at must be a datetime")
        check_run_at(spec.run_at)
    if spec.delay_seconds is not None and not (
        _is_number(spec.delay_seconds)
        and math.isfinite(spec.delay_seconds)
        and 0 <= spec.delay_seconds <= MAX_DELAY_SECONDS
    ):
        raise InvalidJob("delay_seconds must be a number from 0 to ten years")
    if spec.idempotency_key is not None and not (0 < len(spec.idempotency_key) <= 255):
        raise InvalidJob("an idempotency key must be 1 to 255 characters")
    if spec.idempotency_key is not None and request_hash is None:
        request_hash = spec_hash(spec)
    unique = unique_key_for(spec.type, payload, spec.unique_for, spec.unique_key)
    return NewJob.of(  # positional, in NewJob's field order
        new_job_id(),  # id
        spec.type,  # job_type
        payload_json.decode(),  # payload_json
        parse_priority(spec.priority),  # priority
        spec.max_retries,  # max_retries
        spec.timeout_seconds,  # timeout_seconds
        spec.run_at,  # run_at
        spec.delay_seconds,  # delay_seconds
        spec.idempotency_key,  # idempotency_key
        request_hash,  # request_hash
        encode_meta(spec.meta),  # meta_json
        unique,  # unique_key
        spec.unique_for if unique is not None else None,  # unique_for
    )


def spec_hash(spec: JobSpec) -> str:
    body = {
        "type": spec.type,
        "payload": spec.payload or {},
        "priority": parse_priority(spec.priority),
        "max_retries": spec.max_retries,
        "timeout_seconds": spec.timeout_seconds,
        "run_at": spec.run_at.isoformat() if spec.run_at else None,
        "delay_seconds": spec.delay_seconds,
        **hash_extras(spec.meta, spec.unique_for, spec.unique_key),
    }
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


async def raw_connection(conn: Any) -> Any:
    """The asyncpg connection behind ``conn`` (asyncpg, SQLAlchemy AsyncSession/AsyncConnection)."""
    if hasattr(conn, "fetch") and hasattr(conn, "transaction"):
        return conn  # asyncpg.Connection or a pool proxy
    connection = getattr(conn, "connection", None)
    if connection is not None and callable(connection):  # AsyncSession.connection()
        sa_conn = await conn.connection()
    else:
        sa_conn = conn
    get_raw = getattr(sa_conn, "get_raw_connection", None)
    if get_raw is None:
        raise TypeError(
            "enqueue needs an asyncpg connection or a SQLAlchemy AsyncSession/AsyncConnection"
        )
    raw = await get_raw()
    driver = getattr(raw, "driver_connection", None)
    if driver is None or not hasattr(driver, "fetch"):
        raise TypeError("the SQLAlchemy connection must use the asyncpg driver")
    return driver


async def enqueue(
    conn: Any,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    priority: int | str | None = None,
    max_retries: int | None = None,
    timeout_seconds: float | None = None,
    run_at: datetime | None = None,
    delay_seconds: float | None = None,
    idempotency_key: str | None = None,
    schema: str | None = None,
    meta: Mapping[str, Any] | None = None,
    unique_for: float | None = None,
    unique_key: str | None = None,
) -> uuid.UUID:
    """Enqueue one job on ``conn``, joining its transaction. Returns the job id (for an
    idempotency key seen before with the same arguments, the existing job's id). ``schema``:
    Conveyor's PostgreSQL schema (default ``CONVEYOR_DB_SCHEMA``, else ``conveyor``). A unique
    job (``unique_for``) already held by another job returns that job's id."""
    spec = JobSpec(
        job_type,
        payload,
        priority,
        max_retries,
        timeout_seconds,
        run_at,
        delay_seconds,
        idempotency_key,
        meta,
        unique_for,
        unique_key,
    )
    return (await enqueue_many(conn, [spec], schema=schema))[0]


def store_for(schema: str | None) -> Store:
    """Every statement names the schema: the caller's connection keeps its own search_path."""
    return for_schema(schema or os.environ.get("CONVEYOR_DB_SCHEMA") or DEFAULT_SCHEMA)


async def enqueue_many(
    conn: Any, specs: Sequence[JobSpec], *, notify: bool = True, schema: str | None = None
) -> list[uuid.UUID]:
    """Enqueue several jobs in one statement on ``conn`` (the caller's transaction).

    ``notify`` wakes the publishers at commit (``pg_notify``); at very high enqueue rates from
    many concurrent transactions pass ``notify=False`` and rely on the relay's polling, since
    NOTIFY serialises commits."""
    store = store_for(schema)
    raw = await raw_connection(conn)
    rows = [build_job(s) for s in specs]
    await check_for_enqueue(raw, store, {r.job_type for r in rows})
    with tracing.submitting(None) as trace_context:  # tracing: the caller's span is the parent
        result = await store.job_insert_checked(raw, rows, trace_context)
    inserted = result.inserted
    if notify and any(r.status == "PENDING" for r in inserted.values()):
        await store.outbox_notify(raw)  # delivered when the caller's transaction commits
    out: list[uuid.UUID] = []
    for row in rows:
        if row.id in inserted:
            out.append(row.id)
            continue
        if row.id in result.duplicates:  # a unique job another submit holds
            out.append(result.duplicates[row.id].id)
            continue
        assert row.idempotency_key is not None
        existing = await store.job_get_by_idempotency_key(raw, row.idempotency_key)
        if existing is None:  # pragma: no cover - a conflict implies the row exists
            raise IdempotencyConflict("idempotency key vanished during insert")
        if existing.request_hash != row.request_hash:
            raise IdempotencyConflict(
                f"idempotency key {row.idempotency_key!r} was used with different arguments"
            )
        out.append(existing.id)
    return out
