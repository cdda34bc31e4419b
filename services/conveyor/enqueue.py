"""Transactional enqueue: a job row and its outbox row written on the caller's connection, inside
the caller's transaction. Works with an asyncpg connection or a SQLAlchemy ``AsyncSession`` /
``AsyncConnection`` on the asyncpg driver."""

from __future__ import annotations

import hashlib
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from .core.errors import IdempotencyConflict, InvalidJob, PayloadTooLarge
from .core.jobs import check_type, new_job_id, parse_priority
from .job_types import check_for_enqueue
from .store import NewJob, Store, for_schema
from .store.schema import DEFAULT_SCHEMA

DEFAULT_MAX_PAYLOAD = 256 * 1024
MAX_DELAY_SECONDS = 10 * 365 * 86400


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
        payload_json = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError as exc:
        raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
    if "\\u0000" in payload_json:
        raise InvalidJob("payload must not contain NUL characters (PostgreSQL jsonb rejects them)")
    if len(payload_json) > max_payload_bytes:
        raise PayloadTooLarge(
            f"payload is {len(payload_json)} bytes; the limit is {max_payload_bytes}"
        )
    if spec.max_retries is not None and not (0 <= spec.max_retries <= 1000):
        raise InvalidJob("max_retries must be between 0 and 1000")
    if spec.timeout_seconds is not None and not (
        0 < spec.timeout_seconds <= 7 * 86400 and math.isfinite(spec.timeout_seconds)
    ):
        raise InvalidJob("timeout_seconds must be > 0 and at most a week")
    if spec.run_at is not None and spec.delay_seconds is not None:
        raise InvalidJob("give run_at or delay_seconds, not both")
    if spec.run_at is not None and spec.run_at.tzinfo is None:
        raise InvalidJob("run_at must carry a timezone (ISO 8601 with an offset or Z)")
    if spec.delay_seconds is not None and not (
        0 <= spec.delay_seconds <= MAX_DELAY_SECONDS and math.isfinite(spec.delay_seconds)
    ):
        raise InvalidJob("delay_seconds must be between 0 and ten years")
    if spec.idempotency_key is not None and not (0 < len(spec.idempotency_key) <= 255):
        raise InvalidJob("an idempotency key must be 1 to 255 characters")
    if spec.idempotency_key is not None and request_hash is None:
        request_hash = spec_hash(spec)
    return NewJob(
        id=new_job_id(),
        job_type=spec.type,
        payload_json=payload_json,
        priority=parse_priority(spec.priority),
        max_retries=spec.max_retries,
        timeout_seconds=spec.timeout_seconds,
        run_at=spec.run_at,
        delay_seconds=spec.delay_seconds,
        idempotency_key=spec.idempotency_key,
        request_hash=request_hash,
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
    }
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


async def _raw_connection(conn: Any) -> Any:
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
) -> uuid.UUID:
    """Enqueue one job on ``conn``, joining its transaction. Returns the job id (for an
    idempotency key seen before with the same arguments, the existing job's id). ``schema``:
    Conveyor's PostgreSQL schema (default ``CONVEYOR_DB_SCHEMA``, else ``conveyor``)."""
    spec = JobSpec(
        job_type, payload, priority, max_retries, timeout_seconds, run_at, delay_seconds,
        idempotency_key,
    )  # fmt: skip
    return (await enqueue_many(conn, [spec], schema=schema))[0]


def _store(schema: str | None) -> Store:
    """Every statement names the schema: the caller's connection keeps its own search_path."""
    return for_schema(schema or os.environ.get("CONVEYOR_DB_SCHEMA") or DEFAULT_SCHEMA)


async def enqueue_many(
    conn: Any, specs: Sequence[JobSpec], *, notify: bool = True, schema: str | None = None
) -> list[uuid.UUID]:
    """Enqueue several jobs in one statement on ``conn`` (the caller's transaction).

    ``notify`` wakes the publishers at commit (``pg_notify``); at very high enqueue rates from
    many concurrent transactions pass ``notify=False`` and rely on the relay's polling, since
    NOTIFY serialises commits."""
    store = _store(schema)
    raw = await _raw_connection(conn)
    rows = [build_job(s) for s in specs]
    await check_for_enqueue(raw, store, {r.job_type for r in rows})
    inserted = await store.job_insert_many(raw, rows)
    if notify and any(r.status == "PENDING" for r in inserted.values()):
        await store.outbox_notify(raw)  # delivered when the caller's transaction commits
    out: list[uuid.UUID] = []
    for row in rows:
        if row.id in inserted:
            out.append(row.id)
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
