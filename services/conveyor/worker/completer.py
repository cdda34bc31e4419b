"""Writing outcomes: batched, fenced, and never stuck on an outcome PostgreSQL refuses.

Outcomes ready at the same moment are written in one transaction (fenced by job id and attempt,
so a worker whose lease was taken over changes nothing). Three kinds of write errors:

- an *outage* (connection lost, timeout, server restarting): retrying cures it; the batch is
  retried with a backoff, for as long as it takes. ``status().oldest_since`` shows how long
  outcomes have waited, and the worker's liveness fails past ``worker_outcome_deadline``.
- a *data error* (SQLSTATE class 22 — NUL in text, ``\\u0000`` in jsonb, invalid JSON, value too
  long —, 23 integrity, 54 program limit; or text that cannot be encoded): retrying never cures
  it. The batch is split in halves until the refused outcome stands alone (the others commit),
  and that one becomes a failure of its job ("... could not be stored: ..."), which consumes a
  retry like any failure. If even that cannot be written, the outcome is dropped with a log line:
  the job's lease expires and the sweeper recovers it. Never an endless retry.
- a *refusal by the deployment* (SQLSTATE class 42: a missing privilege, a table or function the
  schema lacks; 3D, 3F): only an operator cures it. Retried like an outage (nothing is lost or
  failed, liveness fails past the deadline), logged as an error that says what to fix
  (``outcome_write_refused``), at most every 15 s.
- any other error the server answers is *one job's* (``core/isolate.py``: a trigger refusing its
  row, a lock held elsewhere past the lock bound, the statement bound passed, a deadlock):
  retrying the batch would fail alike while that job's cause lasts, so the batch is split as for
  a data error (one outcome at a time when each try waited a whole bound) and the others commit.
  The one that fails alone is *set aside* (``outcome_write_isolated``, with its job's id): tried
  again alone after 1 s, doubling to 60 s, for as long as it fails. Meanwhile its job's slot
  stays taken and its lease is kept by the heartbeat (the job is still running to the rest of
  the system); it is counted in ``status().isolated`` (``outcomes_isolated`` in ``/healthz``)
  and left out of ``oldest_since``: one job's write does not fail the worker's liveness, whose
  restart would stop every other job of the worker.

A completion with a keyed follow-up (``followups.keyed``) is written alone, beside the batch:
while another transaction holds its key it waits (*held*: tried again every few seconds, its
job's lease extended after each try, when the try no longer holds the row the heartbeat skips),
and that wait is neither an outage nor counted against liveness, so it stalls only that job,
never its neighbours' outcomes nor ``/healthz``.

Outcomes written alone (large results, keyed follow-ups) hold at most ``apart`` of the pool's
connections at once; the others wait their turn (a held key's wait between tries holds none).
Each holds its connection while PostgreSQL parses its result (a 10 MB one: about a second on a
loaded machine) or while a key is held, so without the bound as many of them as the pool has
connections would take it all, and the batch, the claims and the heartbeats of every other job
would wait for a connection behind them.

A batch completing workflow jobs may release their dependents (the trigger writes their outbox
rows in the same transaction). With a ``follow`` (the worker's, ``Follow``), the batch is written
in a transaction that also claims some of those released jobs for this worker
(``job_claim_released``: at most as many as the batch's own slots that ``follow.reserve``
counted; their outbox rows taken), and ``done`` starts them at once in those slots: the next job
of a chain, or a fan-out's first leaf, starts without waiting for the relay and the broker. The
others go through the relay as usual. No free slot is set aside for them (the broker may fill
any free slot), so nothing waits for the write.

A batch that ends jobs under admission (a limited or partitioned type: ``running.admitted``)
frees their slots, and its transaction runs the admission pass of their types
(``store.admit``), so the next job of a key is admitted with the commit that freed its slot, as a
workflow's release is; the admission duty's passes cover the rest (a claim freeing a window
place, a retry coming due).

Error texts are always cleaned (no NUL, no lone surrogates) before they are written.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core import isolate
from ..core.backoff import Backoff
from ..core.jobs import Status
from ..core.logging import event
from ..core.metrics import Metrics
from ..store import Attempt, ClaimedJob, Completion, Failure, Store
from . import followups, outcomes, progress
from .outcomes import Kind, Outcome, raised_at
from .running import Running

log = logging.getLogger("conveyor.worker")

_PERMANENT_SQLSTATE_CLASSES = frozenset({"22", "23", "54"})
# A result longer than this is written in a transaction of its own, beside the batch.
LARGE_RESULT_CHARS = 256 * 1024


def _large(outcome: Outcome) -> bool:
    return outcome.result_json is not None and len(outcome.result_json) > LARGE_RESULT_CHARS


def _keyed(p: Pending) -> bool:
    """A completion with a keyed follow-up (its key may be held by another transaction)."""
    return p.outcome.kind is Kind.COMPLETE and followups.keyed(p.running)


def _claim_no_more(batch: list[Pending]) -> None:
    """A batch split for one job's error may set an outcome aside, its slot still taken: its
    parts claim no more released jobs (the relay publishes them), so no claimed job is handed
    a slot that does not free."""
    followed = batch[0].follow
    if followed is not None:
        followed.own = len(followed.jobs)


# SQLSTATE classes of a database that refuses the worker's statements as it is set up: a missing
# privilege (42501), a table or function that does not exist (42P01, 42883: a schema older than
# this version), an unknown database or schema (3D, 3F). Writing again cures them only once an
# operator fixes the deployment, so they are retried like an outage (the outcomes wait, nothing
# is lost or turned into a failure, liveness fails past ``worker_outcome_deadline``), but logged
# as errors that say what to fix, and tried at most every ``REFUSED_RETRY_CAP`` seconds.
_REFUSED_SQLSTATE_CLASSES = frozenset({"42", "3D", "3F"})
REFUSED_RETRY_CAP = 15.0
REFUSED_HINT = (
    "the database refuses the worker's writes as deployed: grant the worker's role its "
    "privileges (conveyor migrate --grant-roles) or migrate the schema (conveyor migrate); the "
    "outcomes wait and are written once it is fixed"
)


def is_refusal(exc: BaseException) -> bool:
    """True when the database refuses the statement as deployed (privileges, schema version)."""
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state[:2] in _REFUSED_SQLSTATE_CLASSES


def is_data_error(exc: BaseException) -> bool:
    """True when writing the same values again cannot succeed."""
    if isinstance(exc, UnicodeError):
        return True
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state[:2] in _PERMANENT_SQLSTATE_CLASSES


@dataclass(eq=False, slots=True)
class Pending:
    running: Running
    outcome: Outcome
    queued_at: float
    written: bool = False
    held_since: float | None = None  # waiting for a follow-up's key another transaction holds
    apart: bool = False  # written in a transaction of its own (a large result, a keyed follow-up)
    follow: Followed | None = None  # the released jobs this batch may claim (shared by its items)
    isolated_since: float | None = None  # its write failed for its own sake (``isolate.py``)
    retry_at: float | None = None  # set aside: when it is tried again (the completer's clock)


@dataclass(eq=False, slots=True)
class Followed:
    """Jobs a batch's completions released that this worker claimed in the same transaction.
    ``own``: how many of the batch's slots (each with its delivery) claimed jobs may take over:
    they free as it commits."""

    own: int
    jobs: list[ClaimedJob] = field(default_factory=list)
    # claimed by a try whose COMMIT got no answer: this worker's if that commit went through
    in_doubt: list[ClaimedJob] = field(default_factory=list)


class Follow(Protocol):
    async def reserve(self, batch: list[Pending]) -> Followed | None:
        """Whether ``batch`` may claim the jobs it releases (None: claim none)."""

    async def claim(self, conn: Any, room: int) -> list[ClaimedJob]:
        """In the completing transaction: claim up to ``room`` jobs it released."""


@dataclass(frozen=True, slots=True)
class CompleterStatus:
    waiting: int  # outcomes not yet committed (queued and being written)
    oldest_since: float | None  # clock time the oldest of them was queued
    failing_since: float | None  # clock time writes began to fail (outage), None when fine
    written_total: int
    unwritable_total: int  # outcomes PostgreSQL refused, turned into failures or dropped
    held: int = 0  # completions waiting for a follow-up's key (not counted in oldest_since)
    isolated: int = 0  # outcomes whose write failed for their own sake (nor these)


@dataclass
class _Counters:
    written: int = 0
    unwritable: int = 0
    failing_since: float | None = None
    in_flight: set[Pending] = field(default_factory=set)


Done = Callable[[list[Pending]], Awaitable[None]]


class Completer:
    def __init__(
        self,
        pool: Any,
        store: Store,
        metrics: Metrics,
        *,
        done: Done,
        wake_relay: Callable[[], None] = lambda: None,
        follow: Follow | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_batch: int = 1000,
        apart: int = 2,
        lease_seconds: float | None = None,
        log_tracebacks: bool = False,
        admission_window: int = 200,
    ) -> None:
        self.pool = pool
        self.admission_window = admission_window  # the admission pass after a freed slot
        self.log_tracebacks = log_tracebacks  # a failure's whole traceback below its log line
        self.lease_seconds = lease_seconds  # what a try held by a key extends its leases to
        self.store = store
        self.metrics = metrics
        self.done = done
        self.wake_relay = wake_relay  # after a commit that wrote outbox rows (a Notifier)
        self.follow = follow
        self.clock = clock
        self.max_batch = max_batch
        self._queue: collections.deque[Pending] = collections.deque()
        self._wake = asyncio.Event()
        self._c = _Counters()
        self._tasks: set[asyncio.Task[None]] = set()  # outcomes being written alone
        self._apart = asyncio.Semaphore(apart)  # connections those may hold at once
        self.aside = isolate.Aside(clock)  # the jobs whose outcome write failed, by failures
        self._isolated: list[Pending] = []  # those outcomes, each until its ``retry_at``

    def put(self, running: Running, outcome: Outcome) -> None:
        self._queue.append(Pending(running, outcome, self.clock()))
        self._wake.set()

    def status(self) -> CompleterStatus:
        c = self._c
        waiting = len(self._queue) + len(c.in_flight)
        flight = [
            p.queued_at for p in c.in_flight if p.held_since is None and p.isolated_since is None
        ]
        oldest = min(flight, default=None)
        if self._queue and (oldest is None or self._queue[0].queued_at < oldest):
            oldest = self._queue[0].queued_at
        held = sum(1 for p in c.in_flight if p.held_since is not None)
        isolated = sum(1 for p in c.in_flight if p.isolated_since is not None)
        return CompleterStatus(
            waiting, oldest, c.failing_since, c.written, c.unwritable, held, isolated
        )

    @property
    def idle(self) -> bool:
        return not self._queue and not self._c.in_flight

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # the next outcome set aside is due
                await asyncio.wait_for(self._wake.wait(), self._next_retry_in())
            self._wake.clear()
            while self._queue or self._retries_due():
                await self.flush_once()

    def _retries_due(self) -> list[Pending]:
        now = self.clock()
        return [p for p in self._isolated if p.retry_at is not None and p.retry_at <= now]

    def _next_retry_in(self) -> float | None:
        """Seconds until an outcome set aside is tried again; None: none is set aside."""
        times = [p.retry_at for p in self._isolated if p.retry_at is not None]
        return max(0.0, min(times) - self.clock()) if times else None

    async def flush_once(self) -> int:
        """One step: write what is queued (up to ``max_batch``), then hand it to ``done``.
        Outcomes with a large result are written alone, beside the batch (a task each, at most
        ``apart`` at once), so a 10 MB result does not hold back every other outcome of the
        worker while PostgreSQL parses it; so are completions with a keyed follow-up (their key
        may be held by another transaction), and so are the outcomes set aside whose wait is
        over. Returns how many outcomes it took."""
        batch: list[Pending] = []
        alone = 0
        for p in self._retries_due():
            self._isolated.remove(p)
            p.retry_at = None
            alone += 1
            self._write_alone(p)
        while self._queue and len(batch) < self.max_batch:
            p = self._queue.popleft()
            if _keyed(p) or _large(p.outcome):
                alone += 1
                self._write_alone(p)
            else:
                batch.append(p)
        if batch:
            await self._write_batch(batch)
        return len(batch) + alone

    def _write_alone(self, p: Pending) -> None:
        """Write ``p`` in a transaction of its own, in a task."""
        self._c.in_flight.add(p)  # not idle from now on, not when the task starts
        p.apart = True
        wait = followups.KEY_WAIT_SECONDS if _keyed(p) else None
        task = asyncio.create_task(self._write_batch([p], wait))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write_batch(self, batch: list[Pending], key_wait: float | None = None) -> None:
        self._c.in_flight.update(batch)
        followed = await self.follow.reserve(batch) if self.follow is not None else None
        settled = batch  # (all of it, should this be cancelled)
        try:
            for p in batch:
                p.follow = followed
            written = await self._commit_isolating(batch, key_wait)
            settled = [p for p in batch if p.retry_at is None]  # not set aside
            for p in settled:
                p.written = p.running.job.id in written
                if p.isolated_since is not None:
                    p.isolated_since = None
                    self.aside.settled(p.running.job.id)
            self._record(settled)
        finally:
            self._c.in_flight.difference_update(settled)
        if settled:
            await self.done(settled)

    async def _commit_isolating(
        self, batch: list[Pending], key_wait: float | None = None
    ) -> set[uuid.UUID]:
        try:
            return await self._commit(batch, key_wait)
        except Exception as exc:  # _commit raises only the rows' errors (isolate.concerns_rows)
            if len(batch) == 1:
                return await self._settle_alone(batch[0], exc)
            failed = exc
        if not is_data_error(failed):
            _claim_no_more(batch)
        if isolate.bound_passed(failed):  # each try waits a whole bound: one at a time
            parts = [[p] for p in batch]
        else:  # each try fails at once: halves, until the outcome at fault stands alone
            mid = len(batch) // 2
            parts = [batch[:mid], batch[mid:]]
        written: set[uuid.UUID] = set()
        for part in parts:
            written |= await self._commit_isolating(part)
        return written

    async def _settle_alone(self, p: Pending, exc: Exception) -> set[uuid.UUID]:
        """An outcome whose write failed alone: a data error makes it a failure of its job;
        any other error of its own sets it aside."""
        if is_data_error(exc):
            return await self._unwritable(p, exc)
        self._set_aside(p, exc)
        return set()

    def _set_aside(self, p: Pending, exc: Exception) -> None:
        """Try ``p`` again alone once its wait (1 s, doubling to 60 s) is over."""
        job = p.running.job
        wait = self.aside.failed(job.id)
        now = self.clock()
        p.held_since = None
        if p.isolated_since is None:
            p.isolated_since = now
        p.retry_at = now + wait
        self._isolated.append(p)
        self._wake.set()  # ``run`` waits for its retry from now on
        event(
            log,
            "outcome_write_isolated",
            logging.WARNING,
            job_id=str(job.id),
            attempt=job.attempt,
            outcome=p.outcome.label,
            error=repr(exc)[:300],
            retry_in=wait,
        )

    async def _unwritable(self, p: Pending, exc: Exception) -> set[uuid.UUID]:
        job = p.running.job
        self._c.unwritable += 1
        what = "result" if p.outcome.kind is Kind.COMPLETE else "outcome"
        event(
            log,
            "job_outcome_unwritable",
            logging.ERROR,
            job_id=str(job.id),
            attempt=job.attempt,
            error=repr(exc)[:300],
        )
        texts = (
            f"the attempt's {what} could not be stored: {type(exc).__name__}: {exc}",
            f"the attempt's {what} could not be stored ({type(exc).__name__})",
        )
        for text in texts:
            p.outcome = outcomes.failure(
                text, retry_count=job.retry_count, max_retries=job.max_retries, spec=p.running.spec
            )
            try:
                return await self._commit([p])  # a failure: no follow-up, no key to wait for
            except Exception as again:
                if not is_data_error(again):  # its row refuses, not the text: tried again
                    self._set_aside(p, again)
                    return set()
                exc = again
        event(
            log,
            "job_outcome_dropped",
            logging.ERROR,
            job_id=str(job.id),
            attempt=job.attempt,
            error=repr(exc)[:300],
        )
        return set()  # the lease expires; the sweeper recovers the job

    async def _commit(self, batch: list[Pending], key_wait: float | None = None) -> set[uuid.UUID]:
        """Write ``batch`` in one transaction; retry outages for as long as it takes, and a
        follow-up's key held by another transaction for as long as it is held."""
        backoff = Backoff(cap=2.0)
        refused = Backoff(base=1.0, cap=REFUSED_RETRY_CAP)
        while True:
            try:
                written = await self._write(batch, key_wait)
                self._c.failing_since = None
                return written
            except followups.KeyHeld as exc:  # the database answered: not an outage
                self._c.failing_since = None
                for p in batch:
                    if p.held_since is None:
                        p.held_since = self.clock()
                        event(
                            log,
                            "outcome_held_by_key",
                            logging.WARNING,
                            job_id=str(p.running.job.id),
                            error=str(exc)[:300],
                        )
                await self._keep_leases(batch)
                await asyncio.sleep(backoff.next())
            except Exception as exc:
                if isolate.concerns_rows(exc):  # a data error, or one job's: isolated
                    raise
                for p in batch:  # an outage counts against liveness, held or not
                    p.held_since = None
                if self._c.failing_since is None:
                    self._c.failing_since = self.clock()
                refusal = is_refusal(exc)
                delay = (refused if refusal else backoff).next()
                event(
                    log,
                    "outcome_write_refused" if refusal else "outcome_write_failed",
                    logging.ERROR if refusal else logging.WARNING,
                    error=repr(exc)[:300],
                    retry_in=round(delay, 2),
                    count=len(batch),
                    **({"hint": REFUSED_HINT} if refusal else {}),
                )
                await asyncio.sleep(delay)

    async def _keep_leases(self, batch: list[Pending]) -> None:
        """Extend the leases of jobs whose completion a key holds, between two tries (their
        rows free again): each try holds their rows, and the heartbeat skips rows held
        elsewhere, so tries spaced by the backoff could keep catching the beats until the lease
        ran out and the sweeper took a job whose handler had completed. Best effort: an outage
        here is the heartbeat's to report."""
        if self.lease_seconds is None:
            return
        try:
            async with self.pool.acquire() as conn:
                await self.store.job_heartbeat_many(
                    conn,
                    [Attempt(p.running.job.id, p.running.job.attempt) for p in batch],
                    lease_seconds=self.lease_seconds,
                )
        except Exception as exc:
            event(log, "held_lease_not_extended", logging.WARNING, error=repr(exc)[:300])

    async def _write(self, batch: list[Pending], key_wait: float | None) -> set[uuid.UUID]:
        done: list[Pending] = []
        fail: list[Pending] = []
        release: list[Pending] = []
        by_kind = {Kind.COMPLETE: done, Kind.FAIL: fail, Kind.RELEASE: release}
        extra = False  # a progress report, or a completion's follow-up jobs, to write beside
        for p in batch:  # one pass: this runs once per job
            by_kind[p.outcome.kind].append(p)
            r = p.running
            if r.last_progress is not None or (r.followups and p.outcome.kind is Kind.COMPLETE):
                extra = True
        written: set[uuid.UUID] = set()
        followed = batch[0].follow
        # released jobs to claim: only a workflow job's completion releases any
        follow = (
            followed is not None
            and len(followed.jobs) < followed.own
            and any(p.running.job.workflow_id is not None for p in done)
        )
        # One statement is atomic by itself: a batch of one kind, with no progress report, no
        # follow-up job to write beside it and no released job to claim, skips BEGIN/COMMIT
        # (two round trips per batch)
        # the types whose slots this batch frees: admitted again in its transaction
        admit = sorted({p.running.job.type for p in batch if p.running.admitted})
        alone = (
            not extra and not follow and not admit and bool(done) + bool(fail) + bool(release) == 1
        )
        claimed: list[ClaimedJob] = []
        sent = False  # every statement ran: an error from here on is the COMMIT's
        try:
            async with (
                self._apart if batch[0].apart else contextlib.nullcontext(),  # its connection only
                self.pool.acquire() as conn,
                contextlib.nullcontext() if alone else conn.transaction(),
            ):
                if followed is not None and followed.in_doubt:
                    await self._resolve(conn, followed)
                await progress.write_last(
                    self.store, conn, [p.running.last_progress for p in batch]
                )
                if done:
                    completed = await self.store.job_complete_many(
                        conn,
                        [
                            Completion(
                                p.running.job.id, p.running.job.attempt, p.outcome.result_json
                            )
                            for p in done
                        ],
                    )
                    written |= completed
                    runs = [p.running for p in done if p.running.job.id in completed]
                    # job.enqueue, same transaction
                    await followups.write(self.store, conn, runs, key_wait=key_wait)
                    if follow and self.follow is not None and followed is not None:
                        claimed = await self.follow.claim(conn, followed.own - len(followed.jobs))
                if fail:
                    failed = await self.store.job_fail_many(
                        conn,
                        [
                            Failure(
                                p.running.job.id,
                                p.running.job.attempt,
                                p.outcome.error,
                                p.outcome.delay,
                                p.outcome.consume,
                            )
                            for p in fail
                        ],
                    )
                    written.update(failed)
                if release:
                    written |= await self.store.job_release_many(
                        conn, [Attempt(p.running.job.id, p.running.job.attempt) for p in release]
                    )
                for job_type in admit:  # a freed slot goes to the next job at once
                    admitted = await self.store.admit(conn, job_type, self.admission_window)
                    self.metrics.jobs_admitted.labels(job_type).inc(admitted)
                sent = True
        except Exception:
            if sent and claimed and followed is not None:
                # the COMMIT failed without an answer: the server may have committed it (a
                # connection lost as it did), and the claimed jobs would then be this worker's,
                # IN_PROGRESS with no one running them; the next try finds out (``_resolve``)
                followed.in_doubt = claimed
            raise
        if followed is not None:  # committed: this worker runs them
            followed.jobs.extend(claimed)
        if fail or release or admit:  # retries, dead letters, admissions: outbox rows
            self.wake_relay()
        return written

    async def _resolve(self, conn: Any, followed: Followed) -> None:
        """Jobs claimed by a try whose COMMIT got no answer are this worker's when they are
        IN_PROGRESS at the attempt that claim gave them (had the claim rolled back, its release
        would have too: no other worker could have claimed them since)."""
        rows, followed.in_doubt = followed.in_doubt, []
        states = await self.store.job_fence_many(conn, [r.id for r in rows])
        followed.jobs.extend(
            r for r in rows if states.get(r.id) == (Status.IN_PROGRESS, r.attempts)
        )

    def _record(self, batch: list[Pending]) -> None:
        for p in batch:
            job, outcome = p.running.job, p.outcome
            if p.written:
                self._c.written += 1
                self.metrics.jobs_finished_of(job.type, outcome.label).inc()
                if outcome.label == "snoozed":
                    event(
                        log,
                        "job_snoozed",
                        job_id=str(job.id),
                        type=job.type,
                        attempt=job.attempt,
                        delay=outcome.delay,
                        reason=outcome.error,
                    )
                elif outcome.kind is Kind.FAIL:
                    error, _, below = (outcome.error or "").partition("\n")
                    event(
                        log,
                        "job_attempt_failed",
                        logging.WARNING,
                        job_id=str(job.id),
                        type=job.type,
                        attempt=job.attempt,
                        outcome=outcome.label,
                        delay=outcome.delay,
                        error=error[:300],  # describe() puts "Type: message" first
                        at=raised_at(below),
                        **({"traceback": below} if self.log_tracebacks else {}),
                    )
            else:
                self.metrics.fenced_writes.inc()
                event(
                    log,
                    "job_write_fenced",
                    logging.WARNING,
                    job_id=str(job.id),
                    attempt=job.attempt,
                    outcome=outcome.label,
                )
