"""Follow-up jobs (``job.enqueue`` in a handler): validated when the handler asks, kept with its
attempt, and inserted (with their outbox rows) in the transaction that writes the attempt's
COMPLETED transition, only for attempts that transaction really completed. A failed, timed-out,
cancelled or fenced attempt (its lease was taken over) leaves no follow-up.

A follow-up with a unique or idempotency key (``keyed``) may have to wait for another
transaction: an application's open transaction that enqueued a job with the same key holds it
until it commits or rolls back (``store/jobs.py``). So such a completion is written in a
transaction of its own, never in the worker's shared batch, and its insert waits at most
``KEY_WAIT_SECONDS`` (``lock_timeout``): then the transaction rolls back (``KeyHeld``) and the
completer tries again later. The completion and its follow-ups still commit together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..jobs.spec import JobSpec, build_job
from ..store import Connection, NewJob, Store
from .running import Running

KEY_WAIT_SECONDS = 0.5
_LOCK_NOT_AVAILABLE = "55P03"


class KeyHeld(Exception):
    """A follow-up's key is held by another open transaction: nothing was written, try later."""


def keyed(running: Running) -> bool:
    return any(j.unique_key is not None or j.idempotency_key is not None for j in running.followups)


def build_followup(
    job_type: str, payload: Any, options: dict[str, Any], *, max_payload_bytes: int
) -> NewJob:
    """The row of a follow-up (``InvalidJob`` / ``PayloadTooLarge`` / ``TypeError`` now, in the
    handler, not at completion)."""
    return build_job(
        JobSpec(type=job_type, payload=payload, **options), max_payload_bytes=max_payload_bytes
    )


async def write(
    store: Store, conn: Connection, completed: Sequence[Running], *, key_wait: float | None = None
) -> int:
    """In the completing transaction, after ``job_complete_many`` wrote ``completed`` (the
    attempts it returned): insert the follow-ups of those that ended COMPLETED (not CANCELLED).
    Returns how many jobs were inserted. Costs nothing when no attempt enqueued anything.
    ``key_wait``: wait at most that long for a key another transaction holds (``KeyHeld``)."""
    asked = [r for r in completed if r.followups]
    if not asked:
        return 0
    ok = await store.job_completed_among(conn, [(r.job.id, r.job.attempt) for r in asked])
    jobs = [j for r in asked if r.job.id in ok for j in r.followups]
    if not jobs:
        return 0
    # job_insert_checked: meta and unique_for/unique_key go through the full insert (a plain
    # insert has no columns for them); a duplicate of a unique follow-up is not inserted
    if key_wait is None:
        done = await store.job_insert_checked(conn, jobs)
    else:
        await store.job_unique_wait_bound(conn, key_wait)
        try:
            done = await store.job_insert_checked(conn, jobs)
        except Exception as exc:
            if getattr(exc, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                raise KeyHeld(str(exc)) from exc
            raise
    await store.outbox_notify(conn)
    return len(done.inserted)
