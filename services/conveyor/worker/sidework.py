"""The worker's own default executor: ``asyncio.to_thread`` and ``run_in_executor(None, …)``.

asyncio's default ``ThreadPoolExecutor`` has ``min(32, cpus + 4)`` threads. A handler that times
out while ``await asyncio.to_thread(blocking)`` runs is cancelled, but its thread is not: it keeps
its pool thread, and a few such attempts fill the pool, so every later ``to_thread`` call of the
worker queues behind them and times out without starting. And the interpreter joins those
threads at exit, so SIGTERM waited for them.

``SideThreads`` runs each call in a fresh daemon thread instead (nothing queues behind a stuck
one, nothing is joined at exit), and ties each call to the attempt whose handler made it (the
``ATTEMPT`` context variable, set in the attempt's task: ``run_in_executor`` submits from the
caller's context). The executor then keeps the attempt's slot busy — its job ``IN_PROGRESS``,
its lease renewed — until every thread it started has ended (``Executor.run_one``).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import itertools
import threading
from collections.abc import Callable
from typing import Any

ATTEMPT: contextvars.ContextVar[Any] = contextvars.ContextVar("conveyor_attempt", default=None)

_names = itertools.count(1)


class SideThreads(concurrent.futures.ThreadPoolExecutor):
    """A thread per call, daemon, counted; ``shutdown`` never waits (see the module's doc). A
    ``ThreadPoolExecutor`` only by type (asyncio's ``set_default_executor`` requires one): none
    of its pool is used."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="conveyor-side-unused")
        self._lock = threading.Lock()
        self.alive = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        owner = ATTEMPT.get()
        if owner is not None:
            owner.side_work.add(fut)
            fut.add_done_callback(owner.side_work.discard)

        def body() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    fut.set_exception(exc)
            with self._lock:
                self.alive -= 1

        with self._lock:
            self.alive += 1
        thread = threading.Thread(target=body, name=f"conveyor-side-{next(_names)}", daemon=True)
        try:
            thread.start()
        except BaseException:
            with self._lock:
                self.alive -= 1
            raise
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to wait for: the threads are daemon threads, and what they were doing for an
        attempt was handed back or fenced by the drain."""


SIDE_THREADS = SideThreads()  # one per process: every worker's loop uses it
