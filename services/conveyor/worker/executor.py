"""Running handlers: every attempt ends in exactly one ``Outcome``, whatever the handler does.

Async handlers run in a task each, under ``asyncio.timeout``; sync handlers in threads (see
``threads.py``: the timeout counts from the thread's start). A timeout bounds the work, not just
the await: an attempt whose work goes on past its deadline (a sync handler's thread, an async
handler that swallows its cancellation, threads it started with ``asyncio.to_thread``, see
``sidework.py``) keeps its slot until that work has ended, and its outcome is then a timeout —
a result that arrives after the deadline never completes the job. Work still running
``overrun_limit`` past its deadline is *given up on* (``_give_up``): nothing short of the process's
exit stops it, so its job stays IN_PROGRESS (lease renewed, counted under its type's fleet limit,
noted in ``last_error``), the drain neither waits for it nor hands it back, liveness fails
(``health.py``), and its timeout is written only once the work has ended: the job is never
released for a retry that would run beside it. If the process exits first, the lease runs out and
lease recovery retries the job. What a handler raises is a failure
that consumes a retry — ``CancelledError`` that nobody asked for, ``SystemExit``,
``KeyboardInterrupt`` and ``GeneratorExit`` included — except ``Retry`` (another attempt, no retry
consumed) and a cancellation by the drain (the job is handed back). An exception whose ``__str__``
raises is still described.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import tracing
from ..core.errors import Retry
from ..core.logging import event
from ..core.metrics import Metrics
from ..jobs.router import Middleware
from . import outcomes
from .guard import BlockPenalty, LoopBlocked
from .middleware import chain, sync_call
from .outcomes import Outcome
from .running import Running
from .sidework import ATTEMPT
from .threads import HandlerThreads, HandlerTimeout

log = logging.getLogger("conveyor.worker")

Report = Callable[[Running, Outcome], None]


@dataclass(frozen=True, slots=True)
class ExecutorStatus:
    running: int  # attempts whose handler has not returned
    threads_alive: int
    threads_abandoned: int
    threads_waiting: int
    threads_waiting_since: float | None
    thread_limit: int
    # the deadlines of attempts whose work still runs past them (sorted: the oldest first)
    overrun_since: tuple[float, ...] = ()
    tasks_abandoned: int = 0  # async handlers given up on (they ignored their cancellation)
    given_up: int = 0  # attempts given up on whose work still runs (their jobs held IN_PROGRESS)


class Executor:
    def __init__(
        self,
        metrics: Metrics,
        *,
        concurrency: int,
        abandoned_limit: int,
        report: Report,
        max_result_bytes: int | None = None,
        overrun_limit: float | None = None,
        middlewares: Sequence[Middleware] = (),
        penalty: BlockPenalty | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.penalty = penalty  # spaces out the attempts of a type caught blocking the loop
        self.middlewares = list(middlewares)
        self.report = report
        self.max_result_bytes = max_result_bytes
        self.clock = clock
        self.threads = HandlerThreads(concurrency, abandoned_limit, clock=clock)
        self.tasks: dict[asyncio.Task[Outcome], Running] = {}
        # past its deadline + this, work that will not stop is given up on (``_give_up``): its
        # job and its slot stay held until it ends, and then its timeout is written
        self.overrun_limit = overrun_limit
        self.given_up: dict[Running, float] = {}  # given up on, still running → its deadline
        # async handlers still running past their deadline + ``overrun_limit`` (they ignore
        # their cancellation, ``_abandon_task``); only a restart of the process ends them
        self.abandoned: set[asyncio.Task[Outcome]] = set()

    def status(self) -> ExecutorStatus:
        t = self.threads.status()
        now = self.clock()
        overrun = sorted(
            [d for r in list(self.tasks.values()) if (d := r.deadline_at) is not None and d < now]
            + list(self.given_up.values())
        )
        return ExecutorStatus(
            len(self.tasks),
            t.alive,
            t.abandoned,
            t.waiting,
            t.waiting_since,
            t.limit,
            tuple(overrun),
            len(self.abandoned),
            len(self.given_up),
        )

    def start(self, running: Running) -> None:
        """Run ``running``'s handler in a task of its own; its outcome goes to ``report``."""
        task = asyncio.create_task(self.run_one(running))
        running.task = task
        self.tasks[task] = running
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[Outcome]) -> None:
        self.tasks.pop(task, None)
        self.abandoned.discard(task)

    async def run_one(self, running: Running) -> Outcome:
        """One step: run the handler to its outcome and report it."""
        started = self.clock()
        ATTEMPT.set(running)  # in this task's context: its to_thread calls are counted
        watchdog = None
        if running.timeout is not None:
            running.deadline_at = started + running.timeout
            if self.overrun_limit is not None and running.spec and running.spec.is_async:
                watchdog = asyncio.get_running_loop().call_later(
                    running.timeout + self.overrun_limit, self._abandon_task, running
                )
        try:
            if tracing.enabled():
                outcome = await self._traced(running)
            else:
                outcome = await self.attempt(running)
        finally:
            if watchdog is not None:
                watchdog.cancel()
        await self._work_ended(running)
        if running.given_up_at is not None:  # its job was held until all its work ended
            while pending := [f for f in running.lingering if not f.done()]:
                await asyncio.wait(pending)
            self.given_up.pop(running, None)
            if running.task is not None:
                self.abandoned.discard(running.task)
            ran = self.clock() - (running.deadline_at or started)
            text = (
                f"TimeoutError: attempt exceeded its timeout of {running.timeout} s; its work "
                f"ran on for {ran:.1f} s past it (its job held until it stopped)"
            )
            outcome = self._failed(running, TimeoutError(), text=text)
        self.metrics.job_duration_of(running.job.type).observe(self.clock() - started)
        self.report(running, outcome)
        return outcome

    def _abandon_task(self, running: Running) -> None:
        """An async handler still running ``overrun_limit`` past its timeout has ignored its
        cancellation: give up on it like on a thread past that bound (``_give_up``); nothing but
        a restart stops it."""
        task = running.task
        if task is None or task.done() or running.releasing:
            return
        self.abandoned.add(task)
        side = [asyncio.wrap_future(f) for f in list(running.side_work) if not f.done()]
        self._give_up(running, side, "ignored its cancellation")

    async def _work_ended(self, running: Running) -> None:
        """Wait until the threads the handler started have ended (its job's slot and lease are
        held until then), or past its deadline + ``overrun_limit`` give up on them. The drain's
        hand-back stops the wait: the process exits right after."""
        while pending := [asyncio.wrap_future(f) for f in list(running.side_work) if not f.done()]:
            left = self._give_up_in(running)
            try:
                _, still = await asyncio.wait(pending, timeout=left)
            except asyncio.CancelledError:
                return
            if still and left is not None and self._give_up_in(running) == 0:
                self._give_up(running, list(still), "left threads running")
                return

    def _give_up_in(self, running: Running) -> float | None:
        if self.overrun_limit is None or running.deadline_at is None:
            return None
        return max(0.0, running.deadline_at + self.overrun_limit - self.clock())

    def _give_up(self, running: Running, work: list[asyncio.Future[Any]], what: str) -> None:
        """``running``'s work (``work``: futures done when each piece ends; an async handler's
        own task is ``running.task``) still runs ``overrun_limit`` past its deadline and cannot
        be stopped. Its job stays IN_PROGRESS, its lease renewed by the heartbeat, so no retry
        runs beside it and its type's fleet count stays true; ``running.note`` says why (written
        to ``last_error`` by the heartbeater). The task leaves ``tasks``: the drain neither waits
        for it nor hands its job back (the process's exit ends the work, then the lease runs out
        and lease recovery retries the job). ``run_one`` writes the timeout once it has all
        ended."""
        running.lingering.extend(work)
        if running.given_up_at is not None:
            return
        running.given_up_at = self.clock()
        self.given_up[running] = running.deadline_at or running.given_up_at
        if running.task is not None:
            self.tasks.pop(running.task, None)
        running.job._cancel.set()  # a handler that polls ``cancel_requested`` may still stop
        running.note = (
            f"TimeoutError: attempt {running.job.attempt} exceeded its timeout of "
            f"{running.timeout} s and {what} for {self.overrun_limit:g} s more: its job stays "
            "IN_PROGRESS until that work stops (or its worker restarts, see the worker's /healthz)"
        )
        event(
            log,
            "job_given_up",
            logging.WARNING,
            job_id=str(running.job.id),
            attempt=running.job.attempt,
            type=running.job.type,
            timeout=running.timeout,
            why=what,
        )

    async def _traced(self, running: Running) -> Outcome:
        """The attempt inside its span (``core/tracing.py``): the handler's own spans nest."""
        job = running.job
        with tracing.attempt(job.type, job.id, job.attempt, running.trace_parent) as span:
            outcome = await self.attempt(running)
            tracing.attempt_outcome(span, outcome.label, outcome.error)
        return outcome

    async def attempt(self, running: Running) -> Outcome:
        """The outcome of one attempt. Never raises."""
        try:
            return await self._attempt(running)
        except BaseException as exc:  # computing the outcome failed: still an outcome
            return outcomes.failure(
                f"{type(exc).__name__} while recording the attempt's outcome",
                retry_count=running.job.retry_count,
                max_retries=running.job.max_retries,
                spec=running.spec,
            )

    async def _attempt(self, running: Running) -> Outcome:
        job, spec, timeout = running.job, running.spec, running.timeout
        deadline: asyncio.Timeout | None = None
        try:
            if spec is None:
                raise LookupError(f"no handler registered for job type {job.type!r}")
            if spec.is_async:
                if self.penalty is not None and (wait := self.penalty.admit(job.type)):
                    raise Retry(wait, f"deferred: {job.type} blocked this worker's event loop "
                                f"(LoopBlocked); one attempt per {wait:g} s runs here")  # fmt: skip
                handler = chain(self.middlewares, spec.func)
                running.in_handler = True  # the loop guard may preempt it (guard.py)
                try:
                    if timeout is None:  # no deadline: no Timeout to enter and leave
                        result = await handler(job)
                    else:
                        async with asyncio.timeout(timeout) as deadline:
                            result = await handler(job)
                        if deadline.expired():  # it swallowed its cancellation, and returned
                            raise TimeoutError
                finally:
                    running.in_handler = False
            else:  # the timeout counts from the thread's start, inside the chain
                call = functools.partial(
                    self.threads.call,
                    on_deadline=job._cancel.set,
                    give_up_after=self.overrun_limit,
                    on_give_up=lambda f: self._give_up(running, [f], "its thread ran on"),
                )
                inner = sync_call(call, spec.func, timeout)
                result = await chain(self.middlewares, inner)(job)
            return outcomes.completed(result, max_bytes=self.max_result_bytes)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if running.releasing or (task is not None and task.cancelling()):
                return outcomes.RELEASE  # the drain: hand the job back
            return self._failed(running, exc)  # raised by the handler itself
        except LoopBlocked as exc:  # the guard preempted it (see guard.py)
            job._cancel.set()
            self._blocked(running)
            return self._failed(running, exc, text=str(exc))
        except HandlerTimeout as exc:
            job._cancel.set()  # a cooperative handler may still stop
            return self._failed(running, exc, text=f"TimeoutError: {exc}")
        except TimeoutError as exc:
            if deadline is not None and deadline.expired():
                text = f"TimeoutError: attempt exceeded its timeout of {timeout} s"
                return self._failed(running, exc, text=text)
            return self._failed(running, exc)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit too
            return self._failed(running, exc)

    def _blocked(self, running: Running) -> None:
        job_type = running.job.type
        self.metrics.loop_blocked.labels(job_type).inc()
        if self.penalty is not None:
            self.penalty.offended(job_type)
        event(
            log,
            "handler_blocked_loop",
            logging.ERROR,
            type=job_type,
            job_id=str(running.job.id),
            attempt=running.job.attempt,
            spaced_for=self.penalty.window if self.penalty else None,
        )

    @staticmethod
    def _failed(running: Running, exc: BaseException, *, text: str | None = None) -> Outcome:
        job = running.job
        if text is not None:
            return outcomes.failure(
                text, retry_count=job.retry_count, max_retries=job.max_retries, spec=running.spec
            )
        return outcomes.failed(
            exc, retry_count=job.retry_count, max_retries=job.max_retries, spec=running.spec
        )

    def hand_back_all(self) -> int:
        """The drain's last resort: cancel every handler still running (their jobs are handed
        back, no retry consumed). Returns how many."""
        n = 0
        for task, running in list(self.tasks.items()):
            if not task.done():
                running.releasing = True
                task.cancel()
                n += 1
        return n
