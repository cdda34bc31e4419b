"""Jobs as workers see them: claim a batch of deliveries, heartbeat, write outcomes. Every write
after the claim is fenced by (job id, attempt): a worker whose lease was taken over changes
nothing."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..core.jobs import Status
from .base import Connection, Statements
from .registry import bind, named
from .rows import Attempt, ClaimedJob, Completion, Failure

JOB_CLAIM_MANY = named("job_claim_many")
JOB_COMPLETE_MANY = named("job_complete_many")
JOB_FAIL_MANY = named("job_fail_many")
JOB_RELEASE_MANY = named("job_release_many")
JOB_HEARTBEAT_MANY = named("job_heartbeat_many")
JOB_TOUCH_WAITING = named("job_touch_waiting")


@dataclass(frozen=True, slots=True)
class HandlerDefaults:
    """Handlers' defaults (type → ``{"max_retries", "timeout"}``) as the claim's JSON argument,
    encoded once per worker instead of once per claim."""

    json: str

    @classmethod
    def of(cls, defaults: Mapping[str, Mapping[str, Any]]) -> HandlerDefaults:
        return cls(orjson.dumps(defaults).decode())


class AttemptStatements(Statements):
    async def job_claim_many(
        self,
        conn: Connection,
        ids: Sequence[uuid.UUID],
        *,
        lease_seconds: float,
        worker_id: str,
        types: Sequence[str],
        handler_defaults: HandlerDefaults | Mapping[str, Mapping[str, Any]],
        default_max_retries: int,
    ) -> list[ClaimedJob]:
        """Claim the runnable jobs among ``ids`` (of the ``types`` this worker runs); the others
        (duplicates, finished or cancelled jobs) are missing from the result. What the submitter
        left out comes from ``handler_defaults`` (type → ``{"max_retries", "timeout"}``; a
        worker passes them encoded once, as ``HandlerDefaults``)."""
        if not isinstance(handler_defaults, HandlerDefaults):
            handler_defaults = HandlerDefaults.of(handler_defaults)
        values = {
            "ids": list(ids),
            "lease_seconds": lease_seconds,
            "worker_id": worker_id,
            "handler_defaults": handler_defaults.json,
            "default_max_retries": default_max_retries,
            "types": list(types),
        }
        rows = await conn.fetch(self.sql[JOB_CLAIM_MANY], *bind(JOB_CLAIM_MANY, values))
        return [ClaimedJob.from_record(r) for r in rows]

    async def job_complete_many(
        self, conn: Connection, items: Sequence[Completion]
    ) -> set[uuid.UUID]:
        """Returns the ids written (a fenced or finished attempt is not)."""
        rows = await conn.fetch(
            self.sql[JOB_COMPLETE_MANY],
            [c.job_id for c in items],
            [c.attempt for c in items],
            [c.result_json for c in items],
        )
        return {r["id"] for r in rows}

    async def job_fail_many(
        self, conn: Connection, items: Sequence[Failure]
    ) -> dict[uuid.UUID, Status]:
        """Returns the new status of each job written (a fenced attempt is missing)."""
        values = {
            "job_id": [f.job_id for f in items],
            "attempt": [f.attempt for f in items],
            "error": [f.error for f in items],
            "delay": [f.delay for f in items],
            "consume": [f.consume for f in items],
        }
        rows = await conn.fetch(self.sql[JOB_FAIL_MANY], *bind(JOB_FAIL_MANY, values))
        return {r["id"]: Status(r["status"]) for r in rows}

    async def job_release_many(self, conn: Connection, items: Sequence[Attempt]) -> set[uuid.UUID]:
        rows = await conn.fetch(
            self.sql[JOB_RELEASE_MANY], [a.job_id for a in items], [a.attempt for a in items]
        )
        return {r["id"] for r in rows}

    async def job_heartbeat_many(
        self, conn: Connection, items: Sequence[Attempt], *, lease_seconds: float
    ) -> dict[uuid.UUID, bool]:
        """Extend the leases still held. Returns, per job whose lease was extended, whether a
        cancellation was requested; a job missing from the result lost its lease."""
        rows = await conn.fetch(
            self.sql[JOB_HEARTBEAT_MANY],
            [a.job_id for a in items],
            [a.attempt for a in items],
            lease_seconds,
        )
        return {r["id"]: r["cancel_requested"] for r in rows}

    async def job_touch_waiting(
        self, conn: Connection, ids: Sequence[uuid.UUID], *, hold_seconds: float
    ) -> None:
        """Mark waiting jobs held by this worker for ``hold_seconds`` (refreshed before then)."""
        await conn.execute(self.sql[JOB_TOUCH_WAITING], list(ids), hold_seconds)
