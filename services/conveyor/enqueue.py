"""Transactional enqueue: a job row and its outbox row written on the caller's connection, inside
the caller's transaction. Works with an asyncpg connection or a SQLAlchemy ``AsyncSession`` /
``AsyncConnection`` on the asyncpg driver. What a valid job is: ``conveyor.jobs``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from .core import tracing
from .core.jobs import JobOptions
from .jobs.spec import JobSpec, build_job, replayed
from .jobs.types import check_for_enqueue
from .store.caller import asyncpg_connection, schema_store

__all__ = ["JobSpec", "enqueue", "enqueue_many"]


async def enqueue(
    conn: Any,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    schema: str | None = None,
    **options: Unpack[JobOptions],
) -> uuid.UUID:
    """Enqueue one job on ``conn``, joining its transaction. Returns the job id (for an
    idempotency key seen before with the same arguments, the existing job's id). ``schema``:
    Conveyor's PostgreSQL schema (default ``CONVEYOR_DB_SCHEMA``, else ``conveyor``). A unique
    job (``unique_for``) already held by another job returns that job's id."""
    spec = JobSpec(job_type, payload, **options)
    return (await enqueue_many(conn, [spec], schema=schema))[0]


async def enqueue_many(
    conn: Any, specs: Sequence[JobSpec], *, notify: bool = True, schema: str | None = None
) -> list[uuid.UUID]:
    """Enqueue several jobs in one statement on ``conn`` (the caller's transaction).

    ``notify`` wakes the publishers at commit (``pg_notify``); at very high enqueue rates from
    many concurrent transactions pass ``notify=False`` and rely on the relay's polling, since
    NOTIFY serialises commits."""
    store = schema_store(schema)
    raw = await asyncpg_connection(conn)
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
        elif row.id in result.duplicates:  # a unique job another submit holds
            out.append(result.duplicates[row.id].id)
        elif row.id in result.debounced:  # folded into the job of its key still waiting
            out.append(result.debounced[row.id].id)
        else:
            conflict = f"idempotency key {row.idempotency_key!r} was used with different arguments"
            out.append((await replayed(store, raw, row, conflict)).id)
    return out
