"""What ``job.set_progress`` and ``job.enqueue`` do inside a worker: one small object per
attempt, attached to its ``Job`` when the attempt starts (``Worker._start``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from ..core.errors import UnknownJobType
from ..jobs.router import Job
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
