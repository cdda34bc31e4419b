"""A claimed job's attempt as the executor runs it (``attempt_of``: the one place a handler's
``Job`` is built from a claim, for the worker and ``conveyor.testing``), and what
``job.set_progress`` and ``job.enqueue`` do inside it: one small object per attempt, attached to
its ``Job``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from ..broker.consume import Delivery
from ..core.errors import UnknownJobType
from ..jobs.router import Job, JobRouter
from ..store import ClaimedJob
from .followups import build_followup
from .progress import ProgressWriter, report
from .running import Running


class AttemptHooks:
    def __init__(
        self,
        running: Running,
        writer: ProgressWriter,
        *,
        known_types: Callable[[], Iterable[str]] | None,
        max_payload_bytes: int,
    ) -> None:
        self.running = running
        self.writer = writer
        self.known_types = known_types  # None: any type is accepted
        self.max_payload_bytes = max_payload_bytes

    def progress(self, job: Job, percent: float, message: str | None) -> None:
        self.writer.put(report(job.id, job.attempt, percent, message))

    def enqueue(self, job: Job, job_type: str, payload: Any, options: dict[str, Any]) -> uuid.UUID:
        if self.known_types is not None:
            known = set(self.known_types())
            if job_type not in known:
                raise UnknownJobType(job_type, sorted(known))
        row = build_followup(job_type, payload, options, max_payload_bytes=self.max_payload_bytes)
        self.running.followups.append(row)  # list.append: safe from a handler's thread
        return row.id


def attempt_of(
    row: ClaimedJob,
    router: JobRouter,
    started: float,
    progress: ProgressWriter,
    *,
    known_types: Callable[[], Iterable[str]] | None,
    max_payload_bytes: int,
    delivery: Delivery | None = None,
) -> Running:
    """The attempt of a claimed job: its handler's ``Job``, its handler (None: not registered
    here) and its hooks; ``started`` is the worker's clock at the claim."""
    job = Job(
        id=row.id,
        type=row.job_type,
        payload=row.payload,
        attempt=row.attempts,
        priority=row.priority,
        retry_count=row.retry_count,
        max_retries=row.max_retries,
        meta=row.meta or {},
        workflow_id=row.workflow_id,
        dependencies=row.parents or {},
    )
    running = Running(job, router.handlers.get(job.type), row.timeout_seconds, started, delivery)
    running.admitted = row.admitted
    job._hooks = AttemptHooks(
        running, progress, known_types=known_types, max_payload_bytes=max_payload_bytes
    )
    return running
