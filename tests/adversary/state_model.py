"""A Hypothesis stateful model of the job state machine against the real store.

The machine plays every actor at random: the API (submit, cancel, redrive), the relay (outbox →
a modelled broker: a work queue and a holding pen), the broker (a pen's TTL elapses, a message is
lost, a message is delivered twice), workers (claim, complete, fail, ``Retry``, hand-back,
heartbeat — with current or stale attempts) and the sweeper (lease expiry + recovery, promotion,
reconciliation). After every step it checks, from the database and an audit trigger that records
every status change:

- every status change is an edge of ``TRANSITIONS``; ``attempts`` grows only by a claim;
- at most one transition into COMPLETED per job, and nothing after it;
- a write is accepted exactly when its attempt is the job's current, IN_PROGRESS attempt;
- ``retry_count <= max_retries`` (optional: see ``check_retry_bound``);
- ``attempts`` within the job's budget: (redrives + 1) * (max_retries + 1) + snoozes + hand-backs;
- every non-terminal job has a way forward: SCHEDULED/RETRYING have a ``run_at``, IN_PROGRESS a
  lease, PENDING/RETRYING an outbox row, a message, or the reconciler's eligibility (no outbox row);
- the reconciler's bound: once time passes beyond ``reconcile_after``, its two passes re-publish
  every stranded job that is overdue when no ready message can stand for it (a ready message
  can stand for an overdue job only beyond the type's fresh jobs: due, not overdue, no outbox
  row — some queued jobs are drawn fresh at each reconcile step);

and at the end of each example it drives every job to a terminal state with the system's own
moves only (liveness: nothing is stuck).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from conveyor.core.errors import Retry
from conveyor.core.jobs import CANCELLABLE, REDRIVABLE, Status
from conveyor.worker import outcomes

from .model_state import TERMINAL_NAMES, Context, ModelState, RetryBoundViolated
from .storeops import JOB_TYPE, Claim, Row

F = TypeVar("F", bound=Callable[..., Any])
__all__ = ["Context", "JobModel", "RetryBoundViolated", "machine"]
WRITES = ["complete", "fail", "retry", "release", "heartbeat"]
ACTIONS: list[tuple[str, Callable[[Any], Any]]] = []


def action(enabled: Callable[[Any], Any]) -> Callable[[F], F]:
    """Register a step the dispatcher may take when ``enabled(machine)`` is truthy.

    One dispatching rule that picks uniformly among the enabled actions, rather than one
    Hypothesis rule each: Hypothesis favours the rules it sorts first (fewest arguments), which
    starved the worker and sweeper moves."""

    def register(f: F) -> F:
        ACTIONS.append((f.__name__, enabled))
        return f

    return register


MAX_JOBS = 3  # few jobs, long histories: deep interleavings rather than wide ones


class JobModel(ModelState):
    """The moves of every actor (one dispatching rule) and the end-of-example liveness drive."""

    # ------------------------------------------------------------------ the API

    @initialize(retries=st.lists(st.sampled_from([None, 0, 1, 2]), min_size=1, max_size=2))
    def jobs_waiting(self, retries: list[int | None]) -> None:
        """A few jobs submitted and relayed before anything else happens."""
        for max_retries in retries:
            self.known.append(self.run(self.ops.submit(max_retries=max_retries, delay=None)))
        self.check()
        self.relay()

    @action(lambda self: len(self.known) < MAX_JOBS)
    def submit(self, data: st.DataObject) -> None:
        max_retries = data.draw(st.sampled_from([None, 0, 1, 2]), label="max_retries")
        delay = data.draw(st.sampled_from([None, 3600.0]), label="delay")
        self.known.append(self.run(self.ops.submit(max_retries=max_retries, delay=delay)))

    @action(lambda self: self.known)
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.known))
        before = self.prev[job_id].status
        done = self.run(self.ops.cancel(job_id))
        assert done == (Status(before) in CANCELLABLE | {Status.IN_PROGRESS}), (before, done)

    @action(lambda self: self.known)
    def redrive(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.known))
        before = self.prev[job_id].status
        done = self.run(self.ops.redrive(job_id))
        assert done == (Status(before) in REDRIVABLE), (before, done)
        self.redrives[job_id] += done

    # ------------------------------------------------------------------ relay and broker

    @action(lambda self: self.outbox)
    def relay(self, data: st.DataObject | None = None) -> None:
        for job_id, destination in self.run(self.ops.relay()):
            self.lost.discard(job_id)
            if destination == "work":
                self.queue.append(job_id)
            elif destination == "retry":
                self.pen.append(job_id)

    @action(lambda self: self.pen)
    def pen_elapses(self, data: st.DataObject) -> None:
        job_id = self.pen.pop(data.draw(st.integers(0, len(self.pen) - 1)))
        self.run(self.ops.make_due(job_id))
        self.queue.append(job_id)

    @action(lambda self: self.queue)
    def lose_message(self, data: st.DataObject) -> None:
        """The broker loses a message (a purged queue, a node lost)."""
        self.lost.add(self.queue.pop(data.draw(st.integers(0, len(self.queue) - 1))))

    # ------------------------------------------------------------------ workers

    @action(lambda self: self.queue)
    def deliver(self, data: st.DataObject) -> None:
        """One delivery (or two copies arriving in one batch) → one claim."""
        copies = data.draw(st.integers(1, 2), label="copies")
        self._deliver(self.queue.pop(data.draw(st.integers(0, len(self.queue) - 1))), copies)

    def _deliver(self, job_id: uuid.UUID, copies: int = 1) -> None:
        if not self._claim([job_id] * copies) and self.prev[job_id].status == "RETRYING":
            self.lost.add(job_id)  # delivered before it was due: dropped, the reconciler's

    @action(lambda self: self.known)
    def duplicate_delivery(self, data: st.DataObject) -> None:
        """A copy of a message that was already delivered (redelivery, relay crash)."""
        self._claim([data.draw(st.sampled_from(self.known))])

    def _claim(self, ids: list[uuid.UUID]) -> bool:
        before = self.prev[ids[0]]
        claims = self.run(self.ops.claim(ids, "w"))
        assert len(claims) <= 1, f"one job claimed twice in one batch: {claims}"
        if before.status == "PENDING":
            assert claims, f"a PENDING job was not claimed: {before}"
        elif before.status != "RETRYING":  # RETRYING: only once due
            assert not claims, f"a {before.status} job was claimed: {before}"
        self.handles.extend(claims)
        return bool(claims)

    def _current(self) -> list[Claim]:
        """Attempts their worker still holds: the job is IN_PROGRESS with that attempt."""
        return [c for c in self.handles if self._is_current(c)]

    def _stale(self) -> list[Claim]:
        """Attempts taken over (lease expired, re-claimed) or already finished."""
        return [c for c in self.handles if not self._is_current(c)]

    def _fenced(self, c: Claim, accepted: bool, what: str) -> None:
        current = self._is_current(c)
        assert accepted == current, (
            f"{what} of attempt {c.attempt} on {self.prev[c.job_id]}: accepted={accepted}"
        )

    def _write(self, c: Claim, what: str, delay: int = 0) -> bool:
        """One outcome write of attempt ``c``, decided as the worker decides it."""
        if what == "complete":
            accepted = self.run(self.ops.complete(c, {"attempt": c.attempt}))
        elif what == "fail":
            outcome = outcomes.failure(
                "boom", retry_count=c.retry_count, max_retries=c.max_retries, spec=None,
                rng=self.rng,
            )  # fmt: skip
            accepted = self.run(self.ops.fail(c, outcome))
        elif what == "retry":  # the handler raised Retry(delay): no retry consumed
            outcome = outcomes.failed(
                Retry(delay), retry_count=c.retry_count, max_retries=c.max_retries, spec=None
            )
            accepted = self.run(self.ops.fail(c, outcome))
            self.snoozes[c.job_id] += accepted
        elif what == "release":
            accepted = self.run(self.ops.release(c))
            self.releases[c.job_id] += accepted
        else:
            accepted = self.run(self.ops.heartbeat(c))
        self._fenced(c, accepted, what)
        return accepted

    @action(lambda self: self._current())
    def worker_writes(self, data: st.DataObject) -> None:
        what = data.draw(st.sampled_from(WRITES), label="what")
        delay = data.draw(st.sampled_from([0, 1, 30]), label="delay")
        self._write(data.draw(st.sampled_from(self._current())), what, delay)

    @action(lambda self: self._stale())
    def stale_writer(self, data: st.DataObject) -> None:
        """A worker whose attempt was superseded (or already written) wakes up and writes."""
        what = data.draw(st.sampled_from(WRITES), label="what")
        self._write(data.draw(st.sampled_from(self._stale())), what)

    # ------------------------------------------------------------------ the sweeper

    @action(lambda self: self._with("IN_PROGRESS"))
    def lease_expires(self, data: st.DataObject) -> None:
        """The worker died: its lease runs out and the sweeper's recovery moves the job on."""
        job_id = data.draw(st.sampled_from(self._with("IN_PROGRESS")))
        self.run(self.ops.expire_lease(job_id))
        self.run(self.ops.recover_leases())
        jobs, _ = self.run(self.ops.snapshot())
        assert jobs[job_id].status != "IN_PROGRESS", f"expired lease not recovered: {jobs[job_id]}"

    @action(lambda self: self._with("SCHEDULED"))
    def schedule_arrives(self, data: st.DataObject) -> None:
        self.run(self.ops.make_due(data.draw(st.sampled_from(self._with("SCHEDULED")))))
        assert self.run(self.ops.promote_due()) == 1

    def _stranded(self) -> list[uuid.UUID]:
        """Runnable jobs with neither an outbox row nor a message."""
        on_its_way = self.outbox | set(self.queue) | set(self.pen)
        runnable = ("PENDING", "RETRYING")
        return [j for j in self.known if self.prev[j].status in runnable and j not in on_its_way]

    @action(lambda self: self._stranded())
    def reconcile(self, data: st.DataObject | None = None) -> None:
        """Time passes beyond ``reconcile_after``; the reconciler compares with the queue. Some
        queued jobs are fresh (touched just now: published moments ago). Its bound: when no
        ready message can stand for them, every stranded job that is now overdue (PENDING, or
        RETRYING and due for ``reconcile_after``) is re-published by the two passes, not just
        eventually (a RETRYING job whose retry vanished; a lost job behind fresh messages).
        Only the ready messages beyond the fresh jobs can stand for overdue ones."""
        after = self.ops.settings.reconcile_after
        self.run(self.ops.age_all(after + 1))
        stranded = self._stranded()
        jobs, outbox = self.run(self.ops.snapshot())
        now = self.run(self.ops.now())
        fresh = self._draw_fresh(data, jobs, outbox, now)
        self.run(self.ops.reconcile({JOB_TYPE: len(self.queue)}))
        if len(self.queue) > len(fresh):
            return  # ready messages may stand for them: the reconciler cannot tell whose
        _, outbox = self.run(self.ops.snapshot())
        for j in stranded:
            row = jobs[j]
            overdue = row.run_at is None or (now - row.run_at).total_seconds() > after
            assert not overdue or j in outbox, f"stranded, overdue, not re-published: {row}"

    def _draw_fresh(
        self,
        data: st.DataObject | None,
        jobs: dict[uuid.UUID, Row],
        outbox: set[uuid.UUID],
        now: datetime,
    ) -> list[uuid.UUID]:
        """Queued jobs the reconciler will count as fresh, drawn and touched now: PENDING, or
        RETRYING and due, with no outbox row (a stale copy's job is none of these)."""
        due = [j for j in dict.fromkeys(self.queue) if j not in outbox
               and jobs[j].status in ("PENDING", "RETRYING")
               and (jobs[j].run_at is None or jobs[j].run_at <= now)]  # fmt: skip
        if data is None or not due:
            return []
        fresh = data.draw(st.lists(st.sampled_from(due), unique=True), label="fresh")
        self.run(self.ops.freshen(fresh))
        return fresh

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        enabled = [name for name, ok in ACTIONS if ok(self)]
        name = data.draw(st.sampled_from(enabled), label="action")
        getattr(self, name)(data)

    # ------------------------------------------------------------------ liveness

    def teardown(self) -> None:
        """Drive every job to a terminal state with the system's own moves: messages are
        delivered, attempts complete, pens and schedules elapse, the reconciler runs."""
        for _ in range(12):
            self.check()
            pending = [j for j in self.known if self.prev[j].status not in TERMINAL_NAMES]
            if not pending:
                return
            current = {(c.job_id, c.attempt): c for c in self.handles}
            for j in self._with("IN_PROGRESS"):
                c = current.get((j, self.prev[j].attempts))
                if c is None:
                    self.run(self.ops.expire_lease(j))
                else:
                    self._write(c, "complete")
            self.run(self.ops.recover_leases())
            for j in self._with("SCHEDULED"):
                self.run(self.ops.make_due(j))
            self.run(self.ops.promote_due())
            self.relay()
            for j in self.pen:
                self.run(self.ops.make_due(j))
            self.queue += self.pen
            self.pen.clear()
            self.check()
            while self.queue:
                self._deliver(self.queue.pop(0))
                self.check()
            self.reconcile()
        self.check()
        stuck = {str(j): self.prev[j] for j in self.known if self.prev[j].status not in
                 TERMINAL_NAMES}  # fmt: skip
        assert not stuck, f"stuck after driving the system: {stuck}"


def machine(ctx: Context) -> type[JobModel]:
    return type("JobStateModel", (JobModel,), {"ctx": ctx})
