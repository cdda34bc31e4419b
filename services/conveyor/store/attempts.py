"""Jobs as workers see them: claim a batch of deliveries, heartbeat, report progress, write
outcomes, and read a job's attempts. Every write after the claim is fenced by (job id, attempt):
a worker whose lease was taken over changes nothing.

The claim is ``job_claim_many``, one conditional UPDATE for a batch of deliveries. Limits are
not the claim's business: a job of a limited type was admitted before it was published
(``sql/schema/admission.sql``), so every delivered job may start.

Each finishing statement (``sql/attempts.sql``, ``sql/maintenance.sql``) writes its attempt rows
itself (one INSERT into ``job_attempts`` in the same statement, so the hot path takes no extra
round trip). The attempt still running is not in ``job_attempts``: ``job_attempt_list`` reads it
from its ``jobs`` row (attempt number, worker, start), which the claim already wrote."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..core.jobs import Status
from .base import Connection, Statements
from .registry import bind, named
from .rows import Attempt, AttemptRow, ClaimedJob, Completion, Failure

JOB_CLAIM_MANY = named("job_claim_many")
JOB_CLAIM_RELEASED = named("job_claim_released")
JOB_COMPLETE_MANY = named("job_complete_many")
JOB_FAIL_MANY = named("job_fail_many")
JOB_RELEASE_MANY = named("job_release_many")
JOB_HEARTBEAT_MANY = named("job_heartbeat_many")
JOB_TOUCH_WAITING = named("job_touch_waiting")
JOB_NOTE_MANY = named("job_note_many")
JOB_PROGRESS_MANY = named("job_progress_many")
JOB_COMPLETED_AMONG = named("job_completed_among")
JOB_ATTEMPT_LIST = named("job_attempt_list")


@dataclass(frozen=True, slots=True)
class HandlerDefaults:
    """Handlers' defaults (type → ``{"max_retries", "timeout"}``) as the claim's JSON argument,
    encoded once per worker instead of once per claim."""

    json: str

    @classmethod
    def of(cls, defaults: Mapping[str, Mapping[str, Any]]) -> HandlerDefaults:
        return cls(orjson.dumps(defaults).decode())


@dataclass(frozen=True, slots=True)
class Beat:
    """One heartbeat's answer. ``extended``: per job whose lease was extended, whether its
    cancellation was requested. ``busy``: jobs still running whose row another transaction held
    (not extended this time, not lost). A job in neither lost its lease."""

    extended: dict[uuid.UUID, bool]
    busy: set[uuid.UUID]


@dataclass(frozen=True, slots=True)
class ProgressReport:
    job_id: uuid.UUID
    attempt: int
    percent: float
    message: str | None


def claim_values(
    ids: Sequence[uuid.UUID],
    lease_seconds: float,
    worker_id: str,
    types: Sequence[str],
    handler_defaults: HandlerDefaults | Mapping[str, Mapping[str, Any]],
    default_max_retries: int,
) -> dict[str, Any]:
    """The parameters both claims share, by name (``job_claim_many``'s keywords)."""
    if not isinstance(handler_defaults, HandlerDefaults):
        handler_defaults = HandlerDefaults.of(handler_defaults)
    return {
        "ids": list(ids),
        "lease_seconds": lease_seconds,
        "worker_id": worker_id,
        "handler_defaults": handler_defaults.json,
        "default_max_retries": default_max_retries,
        "types": list(types),
    }


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
        values = claim_values(
            ids, lease_seconds, worker_id, types, handler_defaults, default_max_retries
        )
        rows = await conn.fetch(self.sql[JOB_CLAIM_MANY], *bind(JOB_CLAIM_MANY, values))
        return [ClaimedJob.from_record(r) for r in rows]

    async def job_claim_released(
        self,
        conn: Connection,
        *,
        room: int,
        lease_seconds: float,
        worker_id: str,
        types: Sequence[str],
        handler_defaults: HandlerDefaults | Mapping[str, Mapping[str, Any]],
        default_max_retries: int,
    ) -> list[ClaimedJob]:
        """Inside the transaction that completed jobs: claim up to ``room`` of the jobs their
        completion released (of ``types``, none paused or limited), taking their outbox rows
        so they get no broker message. Returns the claimed jobs."""
        if room < 1:
            return []
        values = claim_values(
            [], lease_seconds, worker_id, types, handler_defaults, default_max_retries
        )
        del values["ids"]
        values["room"] = room
        rows = await conn.fetch(self.sql[JOB_CLAIM_RELEASED], *bind(JOB_CLAIM_RELEASED, values))
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
    ) -> Beat:
        """Extend the leases still held, skipping rows locked elsewhere (``Beat``)."""
        rows = await conn.fetch(
            self.sql[JOB_HEARTBEAT_MANY],
            [a.job_id for a in items],
            [a.attempt for a in items],
            lease_seconds,
        )
        return Beat(
            {r["id"]: r["cancel_requested"] for r in rows if not r["busy"]},
            {r["id"] for r in rows if r["busy"]},
        )

    async def job_note_many(
        self, conn: Connection, notes: Sequence[tuple[Attempt, str]]
    ) -> set[uuid.UUID]:
        """Write each running attempt's note to its job's ``last_error``; returns the jobs
        written (a finished or taken-over attempt's note is not)."""
        rows = await conn.fetch(
            self.sql[JOB_NOTE_MANY],
            [a.job_id for a, _ in notes],
            [a.attempt for a, _ in notes],
            [text for _, text in notes],
        )
        return {r["id"] for r in rows}

    async def job_touch_waiting(
        self, conn: Connection, ids: Sequence[uuid.UUID], *, hold_seconds: float
    ) -> None:
        """Mark waiting jobs held by this worker for ``hold_seconds`` (refreshed before then)."""
        await conn.execute(self.sql[JOB_TOUCH_WAITING], list(ids), hold_seconds)

    async def job_progress_many(
        self, conn: Connection, reports: Sequence[ProgressReport]
    ) -> set[uuid.UUID]:
        """Returns the jobs written (a stale or finished attempt's report is not)."""
        rows = await conn.fetch(
            self.sql[JOB_PROGRESS_MANY],
            [r.job_id for r in reports],
            [r.attempt for r in reports],
            [r.percent for r in reports],
            [r.message for r in reports],
        )
        return {r["id"] for r in rows}

    async def job_completed_among(
        self, conn: Connection, attempts: Sequence[tuple[uuid.UUID, int]]
    ) -> set[uuid.UUID]:
        """Which of these attempts ended COMPLETED: the check that lets their follow-up jobs in
        (``worker/followups.py``)."""
        rows = await conn.fetch(
            self.sql[JOB_COMPLETED_AMONG], [a[0] for a in attempts], [a[1] for a in attempts]
        )
        return {r["id"] for r in rows}

    async def job_attempt_list(
        self, conn: Connection, job_id: uuid.UUID
    ) -> list[AttemptRow] | None:
        """Every attempt of a job, oldest first (the running one with ``outcome`` None); None
        when there is no such job."""
        rows = await conn.fetch(self.sql[JOB_ATTEMPT_LIST], job_id)
        if not rows:
            return None
        return [
            AttemptRow(
                attempt=r["attempt"],
                worker_id=r["worker_id"],
                started_at=r["started_at"],
                finished_at=r["finished_at"],
                outcome=r["outcome"],
                error=r["error"],
                duration_seconds=r["duration_seconds"],
            )
            for r in rows
            if r["attempt"] is not None
        ]
