"""The state model's bookkeeping and its invariants (see ``state_model.py``)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis.stateful import RuleBasedStateMachine, invariant

from conveyor.core.jobs import TERMINAL, TRANSITIONS, Status

from .storeops import Claim, Row, StoreOps

T = TypeVar("T")
# Edges the store takes that TRANSITIONS lacks, tolerated while a fix is pending (none now).
KNOWN_DEVIATIONS: set[tuple[str, str]] = set()
TERMINAL_NAMES = {s.value for s in TERMINAL}


class RetryBoundViolated(AssertionError):
    """``retry_count`` went over ``max_retries``."""


@dataclass
class Context:
    loop: asyncio.AbstractEventLoop
    ops: StoreOps
    check_retry_bound: bool = True


class ModelState(RuleBasedStateMachine):
    """What the model knows of the world, and the invariants checked after every step."""

    ctx: Context  # set by ``machine()``

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.ctx.ops
        self.run(self.ops.reset())
        self.known: list[uuid.UUID] = []
        self.queue: list[uuid.UUID] = []  # messages ready in the work queue
        self.pen: list[uuid.UUID] = []  # messages waiting in a holding pen
        self.handles: list[Claim] = []  # every attempt ever claimed, stale ones included
        self.snoozes: Counter[uuid.UUID] = Counter()
        self.releases: Counter[uuid.UUID] = Counter()
        self.redrives: Counter[uuid.UUID] = Counter()
        self.into_completed: Counter[uuid.UUID] = Counter()
        self.last_attempts: dict[uuid.UUID, int] = {}
        self.prev: dict[uuid.UUID, Row] = {}
        self.outbox: set[uuid.UUID] = set()
        self.lost: set[uuid.UUID] = set()  # their message vanished: the reconciler's to find
        self.seq = 0
        self.rng = random.Random(0)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.ctx.loop.run_until_complete(coro)

    def _with(self, status: str) -> list[uuid.UUID]:
        return [j for j in self.known if self.prev[j].status == status]

    def _is_current(self, c: Claim) -> bool:
        row = self.prev[c.job_id]
        return row.status == "IN_PROGRESS" and row.attempts == c.attempt

    # ------------------------------------------------------------------ invariants

    @invariant()
    def check(self) -> None:
        for a in self.run(self.ops.audit_since(self.seq)):
            self.seq = a.seq
            if a.old_status is not None and a.old_status != a.new_status:
                allowed = TRANSITIONS[Status(a.old_status)]
                edge = (a.old_status, a.new_status)
                assert Status(a.new_status) in allowed or edge in KNOWN_DEVIATIONS, f"{edge} {a}"
                assert self.into_completed[a.job_id] == 0, f"written after COMPLETED: {a}"
            if a.new_status == "COMPLETED" and a.old_status != "COMPLETED":
                self.into_completed[a.job_id] += 1
            if a.attempts != self.last_attempts.get(a.job_id, 0):
                assert a.new_status == "IN_PROGRESS", f"attempts changed without a claim: {a}"
                assert a.attempts == self.last_attempts.get(a.job_id, 0) + 1, a
            self.last_attempts[a.job_id] = a.attempts
        jobs, outbox = self.run(self.ops.snapshot())
        assert set(self.known) <= jobs.keys(), "a submitted job has no row"
        messages = set(self.queue) | set(self.pen)
        for job_id, row in jobs.items():
            self._check_job(job_id, row, job_id in outbox or job_id in messages)
        self.prev, self.outbox = jobs, outbox

    def _check_job(self, job_id: uuid.UUID, row: Row, on_its_way: bool) -> None:
        if row.max_retries is not None:
            if self.ctx.check_retry_bound and row.retry_count > row.max_retries:
                raise RetryBoundViolated(f"retry_count {row.retry_count} > max_retries: {row}")
            budget = (self.redrives[job_id] + 1) * (row.max_retries + 1)
            budget += self.snoozes[job_id] + self.releases[job_id]
            assert row.attempts <= budget, f"{row.attempts} attempts, budget {budget}: {row}"
        if row.status in ("SCHEDULED", "RETRYING"):
            assert row.run_at is not None, f"{row.status} without run_at: {row}"
        if row.status == "IN_PROGRESS":
            assert row.lease_expires_at is not None, f"IN_PROGRESS without a lease: {row}"
        if row.status in ("PENDING", "RETRYING") and not on_its_way:
            # only a message the broker lost (or dropped as early) is the reconciler's to find
            assert job_id in self.lost, f"runnable, yet no outbox row and no message: {row}"
