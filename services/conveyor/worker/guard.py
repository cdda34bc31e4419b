"""Preempting an ``async def`` handler that blocks the event loop.

A handler that calls blocking code (``time.sleep``, a synchronous client, a long computation)
from an ``async def`` stops everything on its worker's loop: heartbeats, claims, outcome writes,
every other job. Nothing that runs *on* the loop can stop it, and ``asyncio.timeout`` only fires
once the loop turns again. The guard watches from a thread of its own: when the task the loop is
executing is a handler's and has blocked the loop for the handler's ``timeout`` (counted as
below), it sends the process ``SIGURG`` (the signal Go's runtime uses for the same purpose:
nothing else uses it). Python runs the signal's handler in the main thread, between two
bytecodes or when a blocking call returns with ``EINTR`` (``time.sleep``, socket reads, lock
waits), and it raises ``LoopBlocked`` there, inside the handler's own code: the attempt fails
like a timeout and the loop runs again. So the other jobs of the worker pause for at most that
limit (plus the monitor's 0.25 s tick), and on a machine short of CPU for as much longer as
their own work would take there.

What counts against a handler is the time its stretch blocked the loop: the stretch's wall time
less the time the loop's thread was runnable but waiting for a CPU (the run-queue delay Linux
reports for the thread, ``/proc/self/task/<tid>/schedstat``). Computing counts, and so does
sleeping in a blocking call (``time.sleep``, a synchronous client), which uses no CPU yet keeps
the loop from turning. Waiting for a core does not: that is the machine's load, not the
handler's doing, and it slows the neighbours' own work alike. Judged by wall time, as the guard
was at first, async handlers computing 0.25 s (half the limit) between awaits were preempted
beside three CPU-bound processes on two cores (12 of 12), and their type was then spaced out.
Why not the thread's CPU time alone: a handler asleep in ``time.sleep(5)`` uses none, so only a
wall bound of several limits would catch it, its neighbours paused that long every time. No such
wall bound is added: a computing stretch is stopped after its limit of CPU, a sleeping one after
its limit of sleep, and one starved of CPU holds the loop longer only as the load stretches every
job's work. Where the run-queue delay cannot be read (not Linux, no schedstat), the guard judges
by wall time (logged at start: ``loop_guard_wall_time``). Waiting for the GIL while another
thread of the worker holds it (a sync handler computing) is sleeping to the kernel, and counts.
A wait still in progress is only reported once the thread runs again, so a check may charge a
few scheduler slices too many.

``CONVEYOR_WORKER_LOOP_BLOCK_LIMIT`` (0.5 s by default; 0: off) preempts sooner than the
timeout, and applies to handlers without one: an async handler blocking the loop longer than that
fails, so its neighbours on the process pause for at most that long (plus the detection). Half a
second lets legitimate async code compute a little between its awaits (asyncio's own debug mode
calls a callback slow past 0.1 s, but only logs it). Preempting alone does not protect the
neighbours from a type whose every job blocks: the next attempt blocks again at once. So
``BlockPenalty`` spaces such a type out on the worker that caught it: at most one of its attempts
per ten limits (5 s) starts there for a minute after its last preemption; the others go back to
their queue for that long without consuming a retry (``Retry``). The preemption is logged
(``handler_blocked_loop``, naming the type) and counted
(``conveyor_worker_loop_blocked_total{type}``).

Not covered: a handler without a ``timeout`` and no block limit (nothing says how long it may
take), and C code that runs long without returning to the interpreter (a regular expression, a C
extension holding the GIL); there liveness fails after ``worker_loop_stall_limit`` and the
orchestrator restarts the worker. A handler that catches ``BaseException`` and blocks again is
preempted again after another limit. The guard needs the loop in the main thread (``conveyor
worker``, ``conveyor dev``); elsewhere it stays off and says so in a log line.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from .loop import LoopMonitor

PREEMPT_SIGNAL = signal.SIGURG

# The limit of the task the loop is executing: seconds it may block the loop (None: not a
# handler that may be preempted).
LimitOf = Callable[[asyncio.Task[object]], float | None]


class LoopBlocked(BaseException):
    """Raised inside an async handler that blocked the worker's event loop past its limit.
    A ``BaseException``, like ``KeyboardInterrupt``: ``except Exception`` does not swallow it."""


@dataclass(frozen=True, slots=True)
class GuardStatus:
    enabled: bool
    preempted_total: int


@dataclass(frozen=True, slots=True)
class _Target:
    task: asyncio.Task[object]
    tick: float  # the monitor's last tick when the guard decided
    message: str


@dataclass(frozen=True, slots=True)
class _Seen:
    task: asyncio.Task[object]
    tick: float  # the monitor's last tick then
    at: float  # clock when first seen executing (since that tick)
    waited: float | None  # the loop thread's run-queue delay then (None: not known)


def run_queue_delay(native_id: int) -> Callable[[], float] | None:
    """A function giving the seconds thread ``native_id`` of this process has spent runnable but
    waiting for a CPU (Linux: the second field of its schedstat, in nanoseconds); None where
    that cannot be read."""
    path = f"/proc/self/task/{native_id}/schedstat"

    def delay() -> float:
        with open(path, "rb") as f:
            return int(f.read().split()[1]) / 1e9

    try:
        delay()
    except (OSError, ValueError, IndexError):
        return None
    return delay


class LoopGuard:
    def __init__(
        self,
        monitor: LoopMonitor,
        limit_of: LimitOf,
        *,
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        waited: Callable[[], float] | None = None,
    ) -> None:
        self.monitor = monitor
        self.limit_of = limit_of
        self.interval = interval
        self.clock = clock
        # seconds the loop's thread has waited for a CPU so far (start() reads the kernel's
        # figure unless one is given; None: not known, stretches are judged by wall time)
        self.waited = waited
        self._waited_given = waited is not None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.enabled = False
        # the task executing at the last check, since when
        self._seen: _Seen | None = None
        self._fired: tuple[asyncio.Task[object], float, float] | None = None  # task, tick, at
        self._target: _Target | None = None
        self._preempted = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def status(self) -> GuardStatus:
        return GuardStatus(self.enabled, self._preempted)

    # ------------------------------------------------------------------ lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Watch ``loop`` (call from it). False when it cannot run in this thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if not _install(self):
            return False
        self.loop = loop
        if not self._waited_given:
            self.waited = run_queue_delay(threading.get_native_id())
        self.enabled = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="conveyor-loop-guard", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        if not self.enabled:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        _uninstall(self)
        self.enabled = False

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            if self.check_once():
                signal.pthread_kill(threading.main_thread().ident or 0, PREEMPT_SIGNAL)

    # ------------------------------------------------------------------ one step

    def check_once(self) -> bool:
        """One step (any thread): True when the task the loop is executing is a handler that
        has blocked it past its limit (the caller then sends the signal). A task must be seen
        executing on two checks in a row with no tick in between, so a handler that merely
        happens to run at the moment of a check is never the one blamed, and it is blamed only
        for the time it has itself been executing (since the first of those checks): handlers
        that each compute a little, one after the other in one turn of the loop, block it for
        their sum, yet none of them blocked it past its limit. It is charged that time less what
        the loop's thread spent waiting for a CPU meanwhile (see the module's docstring)."""
        blocked = self.monitor.blocked_for()
        loop = self.loop
        if blocked <= 0 or loop is None:
            self._seen = None
            return False
        task = asyncio.current_task(loop)
        tick = self.monitor.last_tick_at
        limit = self.limit_of(task) if task is not None else None
        if task is None or limit is None:
            self._seen = None
            return False
        seen = self._seen
        if seen is None or (seen.task, seen.tick) != (task, tick):
            self._seen = _Seen(task, tick, self.clock(), self._waited())
            return False
        executing = min(blocked, self.clock() - seen.at - self._starved(seen))
        if executing < limit:
            return False
        fired = self._fired
        if fired is not None and fired[:2] == (task, tick) and self.clock() - fired[2] < limit:
            return False  # fired already: once per limit while it goes on blocking
        self._fired = (task, tick, self.clock())
        self._target = _Target(
            task,
            tick,
            (
                f"LoopBlocked: the handler blocked the worker's event loop for {executing:.1f} s "
                f"(its limit is {limit:g} s); an "
                "async handler must not call blocking code: make it a sync handler (it runs in a "
                "thread) or use asyncio.to_thread"
            ),
        )
        return True

    def _waited(self) -> float | None:
        try:
            return self.waited() if self.waited is not None else None
        except (OSError, ValueError, IndexError):  # unreadable now: wall time for this stretch
            return None

    def _starved(self, seen: _Seen) -> float:
        """Seconds the loop's thread has waited for a CPU since ``seen``; 0 when not known."""
        now = self._waited()
        if now is None or seen.waited is None:
            return 0.0
        return max(0.0, now - seen.waited)

    def preempt(self) -> None:
        """In the main thread (the signal's handler): raise ``LoopBlocked`` if the loop is still
        executing the handler the guard decided on and has not turned since."""
        target, self._target = self._target, None
        if target is None or self.monitor.last_tick_at != target.tick:
            return
        try:
            current = asyncio.current_task()
        except RuntimeError:  # no loop running in this thread
            return
        # still inside the handler's own code (not the worker's, which records its outcome)
        if current is target.task and self.limit_of(current) is not None:
            self._preempted += 1
            raise LoopBlocked(target.message)


# One handler for the process, shared by the guards of every worker running in it.
_guards: set[LoopGuard] = set()
_previous: object = None


def _on_signal(signum: int, frame: FrameType | None) -> None:
    for guard in list(_guards):
        guard.preempt()


def _install(guard: LoopGuard) -> bool:
    global _previous
    if not _guards:
        current = signal.getsignal(PREEMPT_SIGNAL)
        if current not in (signal.SIG_DFL, signal.SIG_IGN, None):
            return False  # the application uses the signal: leave it alone
        _previous = current
        signal.signal(PREEMPT_SIGNAL, _on_signal)
    _guards.add(guard)
    return True


def _uninstall(guard: LoopGuard) -> None:
    _guards.discard(guard)
    if not _guards and threading.current_thread() is threading.main_thread():
        signal.signal(PREEMPT_SIGNAL, _previous if _previous is not None else signal.SIG_DFL)  # type: ignore[arg-type]


class BlockPenalty:
    """A job type whose handler was preempted for blocking the loop is spaced out on this
    worker: for ``window`` seconds after its last preemption, at most one of its attempts starts
    per ``spacing`` seconds; the others are put back for ``spacing`` seconds without consuming a
    retry (``Retry``). Whatever it blocks then, its neighbours lose at most one limit per
    ``spacing``, however many jobs of the type are queued. Per process, never shared."""

    def __init__(
        self, limit: float, *, window: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.spacing = 10 * limit  # one limit in ten: neighbours keep about 90 %
        self.window = max(window, 2 * self.spacing)
        self.clock = clock
        self._offended: dict[str, float] = {}  # type → clock of its last preemption
        self._started: dict[str, float] = {}  # type → clock of its last admitted attempt

    def offended(self, job_type: str) -> None:
        now = self.clock()
        self._offended[job_type] = self._started[job_type] = now

    def admit(self, job_type: str) -> float | None:
        """None: the attempt runs; else the seconds it is put back for."""
        last = self._offended.get(job_type)
        if last is None:  # the usual case: one dict lookup per attempt
            return None
        now = self.clock()
        if now - last > self.window:
            del self._offended[job_type]
            self._started.pop(job_type, None)
            return None
        since = now - self._started.get(job_type, last)
        if since >= self.spacing:
            self._started[job_type] = now
            return None
        return self.spacing

    def penalised(self) -> list[str]:
        now = self.clock()
        return sorted(t for t, at in self._offended.items() if now - at <= self.window)
