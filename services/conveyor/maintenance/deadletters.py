"""The dead-letter queue, for operators: list, redrive and purge copies of FAILED jobs (and
poison messages). PostgreSQL decides: a dead letter records one failure (its job's id and the
attempt that failed), and only redrives that failure — a job that is no longer FAILED at that
attempt (redriven since, e.g. with ``POST /jobs/{id}/retry``, and then cancelled, completed or
failed again later) makes the letter stale, and any redrive or purge removes it. So a job is
never redriven twice by one failure, nor revived after a cancel. Dead letters never expire on
their own."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..broker.inspect import Inspector
from ..core.jobs import Status
from ..store import Attempt, Store


@dataclass
class DeadLetter:
    job_id: uuid.UUID | None
    job_type: str | None
    error: str | None
    attempt: int | None  # the attempt that failed (None: a letter that carries none)
    status: Status | None  # the job's status in PostgreSQL (None: unknown job or poison)
    attempts: int | None  # the job's attempts in PostgreSQL
    raw: bytes

    @property
    def stale(self) -> bool:
        """The failure this letter records is not the job's current state any more."""
        if self.job_id is None:
            return False  # poison: kept until purged
        if self.status is not Status.FAILED:
            return True
        return self.attempt is not None and self.attempt != self.attempts

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": str(self.job_id) if self.job_id else None,
            "type": self.job_type,
            "attempt": self.attempt,
            "status": self.status.value if self.status else None,
            "stale": self.stale,
            "error": (self.error or "")[:500] or None,
            "raw": None if self.job_id else self.raw[:200].decode("utf-8", "replace"),
        }


Decision = Literal["keep", "drop", "redrive"]


async def scan(
    inspector: Inspector,
    pool: Any,
    store: Store,
    decide: Callable[[DeadLetter], Decision],
    *,
    limit: int | None = None,
) -> list[tuple[DeadLetter, Decision]]:
    """Walk the dead-letter queue once (at most ``limit`` messages). ``decide`` picks per
    message: keep it, drop it, or redrive its job (then drop it). Kept messages go back. A
    redrive the fence refuses (the job moved on meanwhile) drops the letter as stale."""
    seen: list[tuple[DeadLetter, Decision]] = []
    async with inspector.dead_letters(limit) as batch:
        letters = []
        for letter in batch.letters:
            m = letter.message
            letters.append(
                DeadLetter(
                    m.job_id if m else None,
                    m.job_type if m else None,
                    m.error if m else None,
                    m.attempt if m else None,
                    None,
                    None,
                    letter.body,
                )
            )
        ids = [d.job_id for d in letters if d.job_id is not None]
        async with pool.acquire() as conn:
            state = await store.job_fence_many(conn, ids) if ids else {}
            for dl in letters:
                if dl.job_id is not None and dl.job_id in state:
                    dl.status, dl.attempts = state[dl.job_id]
            decisions = [decide(dl) for dl in letters]
            # one statement for every redrive, each fenced by its letter's attempt
            wanted = [
                Attempt(dl.job_id, dl.attempts)
                for dl, d in zip(letters, decisions, strict=True)
                if d == "redrive" and dl.job_id is not None and dl.attempts is not None
            ]
            redriven = set(await store.job_redrive_failed(conn, wanted)) if wanted else set()
            if redriven:
                await store.outbox_notify(conn)  # after the statement's commit
        for letter, dl, decision in zip(batch.letters, letters, decisions, strict=True):
            if decision == "redrive":
                if dl.job_id in redriven:
                    redriven.discard(dl.job_id)  # a second letter of the same failure: stale
                else:
                    decision = "drop"  # the fence refused: the job moved on meanwhile
            if decision in ("drop", "redrive"):
                await letter.settle()
            seen.append((dl, decision))
    return seen


def selector(
    ids: set[uuid.UUID] | None, job_type: str | None, everything: bool
) -> Callable[[DeadLetter], bool]:
    def match(dl: DeadLetter) -> bool:
        if everything:
            return True
        if ids and dl.job_id in ids:
            return True
        return job_type is not None and dl.job_type == job_type

    return match


def redrive_decision(match: Callable[[DeadLetter], bool]) -> Callable[[DeadLetter], Decision]:
    def decide(dl: DeadLetter) -> Decision:
        if dl.stale:
            return "drop"
        if not match(dl):
            return "keep"
        return "redrive" if dl.job_id is not None and dl.status is Status.FAILED else "keep"

    return decide


def purge_decision(match: Callable[[DeadLetter], bool]) -> Callable[[DeadLetter], Decision]:
    def decide(dl: DeadLetter) -> Decision:
        return "drop" if dl.stale or match(dl) else "keep"

    return decide
