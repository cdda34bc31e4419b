"""Follow-up jobs (``job.enqueue`` in a handler): validated when the handler asks, kept with its
attempt, and inserted (with their outbox rows) in the transaction that writes the attempt's
COMPLETED transition, only for attempts that transaction really completed. A failed, timed-out,
cancelled or fenced attempt (its lease was taken over) leaves no follow-up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..enqueue import JobSpec, build_job
from ..store import Connection, NewJob, Store
from .running import Running


def build_followup(job_type: str, payload: Any, options: dict[str, Any], *,
                   max_payload_bytes: int) -> NewJob:  # fmt: skip
    """The row of a follow-up (``InvalidJob`` / ``PayloadTooLarge`` / ``TypeError`` now, in the
    handler, not at completion)."""
    return build_job(
        JobSpec(type=job_type, payload=payload, **options), max_payload_bytes=max_payload_bytes
    )


async def write(store: Store, conn: Connection, completed: Sequence[Running]) -> int:
    """In the completing transaction, after ``job_complete_many`` wrote ``completed`` (the
    attempts it returned): insert the follow-ups of those that ended COMPLETED (not CANCELLED).
    Returns how many jobs were inserted. Costs nothing when no attempt enqueued anything."""
    asked = [r for r in completed if r.followups]
    if not asked:
        return 0
    ok = await store.job_completed_among(conn, [(r.job.id, r.job.attempt) for r in asked])
    jobs = [j for r in asked if r.job.id in ok for j in r.followups]
    if not jobs:
        return 0
    # job_insert_checked: meta and unique_for/unique_key go through the full insert (a plain
    # insert has no columns for them); a duplicate of a unique follow-up is not inserted
    done = await store.job_insert_checked(conn, jobs)
    await store.outbox_notify(conn)
    return len(done.inserted)
