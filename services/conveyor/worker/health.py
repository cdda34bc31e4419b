"""Probes of a worker, designed to tell a wedged worker from a busy one, served from a thread of
their own so they can answer while the event loop is blocked.

- liveness (``/healthz``) fails when:
  - the event loop has not turned for ``worker_loop_stall_limit`` seconds (an ``async def``
    handler blocking it stops every heartbeat on the worker; ``guard.py`` preempts one at its
    timeout, so this is the backstop for handlers without a timeout and for C code);
  - an outcome has waited longer than ``worker_outcome_deadline`` to be written (the database
    is unreachable or refuses the worker's writes, or a row lock holds the write and no lock
    bound ends the wait), or a sync handler has waited that long for a thread; a completion
    whose follow-up's unique key another transaction holds is not counted (it waits for that
    transaction, like a submit of the same key; ``outcomes_held_by_keys``), nor an outcome whose
    write failed for its own sake (a trigger refusing its row, a row lock held past the lock
    bound: set aside and tried again alone, ``outcomes_isolated``): restarting the worker for
    one job's write would stop every other job on it;
  - more handler threads are abandoned (given up on past their timeout + ``worker_overrun_limit``,
    or handed back by a drain, still running) than ``worker_abandoned_thread_limit``;
  - work given up on still runs: an async handler that ignored its cancellation, or a handler's
    thread, still running ``worker_overrun_limit`` past its timeout. Its job stays IN_PROGRESS
    (so that no retry runs beside it) until the work ends, and only a restart of the process
    stops work that never does; the restart's drain finishes or hands back the other jobs, and
    the held job's lease then runs out and lease recovery retries it;
  - its capacity is gone: every slot is held by work that has run past its timeout for longer
    than ``worker_overrun_limit`` (work that cannot be stopped keeps its slot until it ends,
    see ``executor.py``);
  - one of the worker's internal loops ended, or the broker connection stayed down longer than
    ``broker_grace``.
  A busy worker — every slot running a long job — is healthy. Draining is healthy.
- readiness (``/readyz``): connected and consuming.

The probe thread reads ``Worker.snapshot`` (a ``WorkerStatus`` refreshed on every turn of the
loop) and the loop monitor's clock; it never touches the worker's private state.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..core.probes import DownTimer
from .status import WorkerStatus
from .worker import Worker


@dataclass(frozen=True, slots=True)
class Limits:
    broker_grace: float = 60.0
    loop_stall: float = 10.0
    outcome_deadline: float = 60.0
    abandoned_threads: int = 4
    overrun: float = 60.0


def assess(
    s: WorkerStatus, limits: Limits, *, now: float, blocked_for: float, broker_down_for: float
) -> tuple[bool, dict[str, Any]]:
    """Liveness from a status: (healthy, details with the reasons when not)."""
    outcome_wait = 0.0 if s.completer.oldest_since is None else now - s.completer.oldest_since
    since = s.executor.threads_waiting_since
    thread_wait = 0.0 if since is None else now - since
    reasons = []
    if s.dead_parts:
        reasons.append(f"internal loops ended: {', '.join(s.dead_parts)}")
    if broker_down_for > limits.broker_grace:
        reasons.append(f"broker connection down for {broker_down_for:.0f} s")
    if blocked_for > limits.loop_stall:
        reasons.append(f"event loop blocked for {blocked_for:.1f} s (a handler blocking it?)")
    if outcome_wait > limits.outcome_deadline:
        reasons.append(f"an outcome has waited {outcome_wait:.0f} s to be written")
    if s.executor.threads_abandoned > limits.abandoned_threads:
        reasons.append(
            f"{s.executor.threads_abandoned} handler threads abandoned past their "
            f"timeout (limit {limits.abandoned_threads})"
        )
    if s.executor.given_up:
        reasons.append(
            f"{s.executor.given_up} attempts' work still runs over {limits.overrun:g} s past "
            "their timeout and cannot be stopped (their jobs stay IN_PROGRESS until it ends)"
        )
    if thread_wait > limits.outcome_deadline:
        reasons.append(f"a sync handler has waited {thread_wait:.0f} s for a thread")
    overrun = [t for t in s.executor.overrun_since if now - t > limits.overrun]
    if overrun and len(overrun) >= s.concurrency:
        reasons.append(
            f"every slot ({s.concurrency}) held by work running past its timeout for "
            f"over {limits.overrun:g} s"
        )
    healthy = s.stopping or not reasons
    return healthy, {
        "reasons": reasons,
        "broker_connected": s.broker_connected,
        "broker_down_seconds": round(broker_down_for, 1),
        "dead_loops": s.dead_parts,
        "loop_blocked_seconds": round(blocked_for, 2),
        "loop_lag_max_seconds": round(s.loop.max_lag_seconds, 3),
        "handlers_preempted": s.guard.preempted_total,
        "outcomes_waiting": s.completer.waiting,
        "outcomes_held_by_keys": s.completer.held,
        "outcomes_isolated": s.completer.isolated,
        "outcome_wait_seconds": round(outcome_wait, 1),
        "outcomes_unwritable": s.completer.unwritable_total,
        "threads_alive": s.executor.threads_alive,
        "threads_abandoned": s.executor.threads_abandoned,
        "threads_waiting": s.executor.threads_waiting,
        "tasks_abandoned": s.executor.tasks_abandoned,
        "given_up": s.executor.given_up,
        "overrunning": len(s.executor.overrun_since),
        "running": s.running,
        "concurrency": s.concurrency,
        "stopping": s.stopping,
    }


class WorkerHealth:
    def __init__(
        self,
        worker: Worker,
        *,
        broker_grace: float = 60.0,
        duties: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.worker = worker
        self.duties = duties  # the process's relay and duties (``cli/duties.py``): shown only
        st = worker.settings
        self.limits = Limits(
            broker_grace,
            st.worker_loop_stall_limit,
            st.worker_outcome_deadline,
            st.worker_abandoned_thread_limit,
            st.worker_overrun_limit,
        )
        self._down = DownTimer()

    def _status(self) -> WorkerStatus:
        return self.worker.snapshot or self.worker.status()

    def check(self) -> tuple[bool, dict[str, Any]]:
        s = self._status()
        ok, details = assess(
            s,
            self.limits,
            now=self.worker.clock(),
            blocked_for=self.worker.monitor.blocked_for(),
            broker_down_for=self._down.update(s.broker_connected),
        )
        if self.duties is not None:
            details["duties"] = self.duties()
        return ok, details

    def ready(self) -> bool:
        s = self._status()
        return s.broker_connected and s.consuming and not s.stopping


class ProbeServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` over HTTP/1.0, in a daemon thread."""

    def __init__(self, health: WorkerHealth, host: str, port: int) -> None:
        registry = health.worker.metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ctype = "application/json"
                if self.path == "/healthz":
                    ok, details = health.check()
                    status, body = (200 if ok else 503), orjson.dumps(details)
                elif self.path == "/readyz":
                    ok = health.ready()
                    status, body = (200 if ok else 503), orjson.dumps({"ready": ok})
                elif self.path == "/metrics":
                    status, body, ctype = 200, generate_latest(registry), CONTENT_TYPE_LATEST
                else:
                    status, body = 404, b'{"error": "not found"}'
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="conveyor-probes",
            daemon=True,
        )
        self.thread.start()
        # a handler's forked child must not keep the listening socket (a restarted worker
        # could not bind the port while the child lives): close it in every child
        os.register_at_fork(after_in_child=functools.partial(_close_quietly, self.server))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.server.shutdown()
            self.server.server_close()


def _close_quietly(server: ThreadingHTTPServer) -> None:
    with contextlib.suppress(Exception):
        server.socket.close()


async def serve_health(
    worker: Worker,
    host: str,
    port: int,
    *,
    broker_grace: float = 60.0,
    duties: Callable[[], dict[str, Any]] | None = None,
) -> ProbeServer:
    """``duties``: details the process's duties add to ``/healthz`` (never its verdict)."""
    health = WorkerHealth(worker, broker_grace=broker_grace, duties=duties)
    return ProbeServer(health, host, port)


__all__ = ["Limits", "ProbeServer", "WorkerHealth", "assess", "serve_health"]
