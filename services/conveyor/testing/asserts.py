"""Assertions about waiting jobs (PENDING, SCHEDULED, RETRYING), and ``run_job``: a handler
called directly, through the router's middleware, with no database."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..jobs.router import Job, JobRouter
from ..store import JobRow
from ..store.caller import connection_or_pool, schema_store
from ..worker.followups import build_followup
from ..worker.middleware import chain


async def all_enqueued(
    conn: Any,
    type: str | None = None,
    *,
    payload: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    unique_key: str | None = None,
    schema: str | None = None,
) -> list[JobRow]:
    """The waiting jobs (of ``type``, or of every type), oldest first. ``payload`` and ``meta``
    match the jobs holding at least those keys with those values (JSON containment)."""
    async with connection_or_pool(conn) as raw:
        return await schema_store(schema).testing_waiting(
            raw, type, payload=payload, meta=meta, unique_key=unique_key
        )


def _wanted(type: str, payload: Any, meta: Any, unique_key: str | None) -> str:
    parts = [f"{type!r}"]
    if payload is not None:
        parts.append(f"payload ⊇ {dict(payload)!r}")
    if meta is not None:
        parts.append(f"meta ⊇ {dict(meta)!r}")
    if unique_key is not None:
        parts.append(f"unique_key={unique_key!r}")
    return f"{parts[0]} with {', '.join(parts[1:])}" if parts[1:] else parts[0]


async def _context(conn: Any, type: str, schema: str | None) -> str:
    others = await all_enqueued(conn, type, schema=schema)
    if not others:
        return f"no {type!r} job is waiting"
    shown = "; ".join(f"payload={j.payload!r} meta={j.meta!r}" for j in others[:10])
    more = f" (and {len(others) - 10} more)" if len(others) > 10 else ""
    return f"waiting {type!r} jobs: {shown}{more}"


async def assert_enqueued(
    conn: Any,
    type: str,
    *,
    payload: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    unique_key: str | None = None,
    count: int | None = None,
    schema: str | None = None,
) -> list[JobRow]:
    """Fail unless a waiting ``type`` job matches (exactly ``count`` of them, when given).
    Returns the matching jobs. Sees what ``conn`` sees: uncommitted jobs of its own transaction
    too."""
    found = await all_enqueued(
        conn, type, payload=payload, meta=meta, unique_key=unique_key, schema=schema
    )
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    want = _wanted(type, payload, meta, unique_key)
    times = "at least one" if count is None else f"{count}"
    raise AssertionError(
        f"expected {times} waiting {want} job(s), found {len(found)}; "
        f"{await _context(conn, type, schema)}"
    )


async def refute_enqueued(
    conn: Any,
    type: str,
    *,
    payload: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    unique_key: str | None = None,
    schema: str | None = None,
) -> None:
    """Fail if a waiting ``type`` job matches."""
    found = await all_enqueued(
        conn, type, payload=payload, meta=meta, unique_key=unique_key, schema=schema
    )
    if found:
        want = _wanted(type, payload, meta, unique_key)
        shown = "; ".join(f"payload={j.payload!r} meta={j.meta!r}" for j in found[:10])
        raise AssertionError(f"expected no waiting {want} job, found {len(found)}: {shown}")


@dataclass(frozen=True)
class Enqueued:
    """A follow-up a handler enqueued (``job.enqueue``): its type, payload and options."""

    id: uuid.UUID
    type: str
    payload: Any
    options: dict[str, Any]


@dataclass
class JobCall:
    """What ``run_job`` saw: the handler's return value and the follow-ups it enqueued (built
    and validated as a worker would, not written anywhere)."""

    result: Any
    enqueued: list[Enqueued] = field(default_factory=list)


class _Hooks:
    def __init__(self, router: JobRouter, call: JobCall) -> None:
        self.router, self.call = router, call

    def progress(self, job: Job, percent: float, message: str | None) -> None:
        return None

    def enqueue(self, job: Job, job_type: str, payload: Any, options: dict[str, Any]) -> uuid.UUID:
        row = build_followup(job_type, payload, options, max_payload_bytes=256 * 1024)
        self.call.enqueued.append(Enqueued(row.id, job_type, payload, dict(options)))
        return row.id


async def run_job(
    router: JobRouter,
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    meta: Mapping[str, Any] | None = None,
    attempt: int = 1,
    retry_count: int = 0,
    max_retries: int = 0,
) -> JobCall:
    """Call ``type``'s handler once with a ``Job`` built from these values, through the router's
    middleware (a sync handler runs in a thread). What the handler raises propagates."""
    spec = router.handlers.get(type)
    if spec is None:
        raise LookupError(f"no handler registered for job type {type!r}")
    func = spec.func

    async def handler(job: Job) -> Any:
        if spec.is_async:
            return await func(job)
        return await asyncio.to_thread(func, job)

    call = JobCall(None)
    job = Job(
        id=uuid.uuid4(),
        type=type,
        payload=dict(payload or {}),
        attempt=attempt,
        priority=0,
        retry_count=retry_count,
        max_retries=max_retries,
        meta=dict(meta or {}),
        _hooks=_Hooks(router, call),
    )
    call.result = await chain(router.middlewares, handler)(job)
    return call
