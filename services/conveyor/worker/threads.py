"""Threads for synchronous handlers, so a stuck one cannot starve the others.

Each call runs in a fresh daemon thread. The call's timeout is measured from the moment its thread
starts, never while it waits. Python cannot stop a thread, so a call that outlives its timeout
goes on being waited for: ``on_deadline`` is called (the job's ``cancel_requested`` turns true, a
cooperative handler stops) and ``HandlerTimeout`` is raised only once the thread has ended, so the
attempt keeps its concurrency slot — and its job stays IN_PROGRESS, counted under its type's
fleet limit — for as long as the work really runs; what it returns then is ignored. A call is
*abandoned* when its thread still runs ``give_up_after`` seconds past the timeout (the timeout is
raised then; the executor keeps the slot busy until the thread ends) or when its job is handed
back by a drain (the process exits right after): the thread runs on, counted until it ends.
Threads are bounded: ``size`` (the worker's concurrency) plus ``abandoned_limit``; past that a
call waits for a thread, and the worker's liveness reports it (see ``health.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_names = itertools.count(1)


class HandlerTimeout(TimeoutError):
    """The handler ran past its timeout (measured from the start of its thread)."""


@dataclass(frozen=True, slots=True)
class ThreadStatus:
    alive: int  # threads running a handler, abandoned ones included
    abandoned: int  # threads whose call timed out or was handed back, still running
    waiting: int  # calls waiting for a thread (only once abandoned threads pass their limit)
    waiting_since: float | None  # clock time the oldest waiting call began to wait
    limit: int  # threads at most


@dataclass(eq=False, slots=True)
class _Call:
    done: asyncio.Future[tuple[bool, Any]]
    abandoned: bool = False


class HandlerThreads:
    def __init__(
        self, size: int, abandoned_limit: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = size + abandoned_limit
        self.clock = clock
        self._slots = asyncio.Semaphore(self.limit)
        self._alive = 0
        self._abandoned = 0
        self._waiting: dict[int, float] = {}
        self._tokens = itertools.count()

    def status(self) -> ThreadStatus:
        since = min(self._waiting.values(), default=None)
        return ThreadStatus(self._alive, self._abandoned, len(self._waiting), since, self.limit)

    async def call(
        self,
        func: Callable[[Any], Any],
        arg: Any,
        timeout: float | None,
        *,
        on_deadline: Callable[[], None] | None = None,
        give_up_after: float | None = None,
        on_give_up: Callable[[asyncio.Future[Any]], None] | None = None,
    ) -> Any:
        """``func(arg)`` in a thread of its own; ``HandlerTimeout`` once it has run past
        ``timeout`` seconds *and ended*. Exceptions of every kind (``SystemExit`` too) are raised
        here, in the caller. Past ``timeout`` + ``give_up_after`` the thread is abandoned: the
        timeout is raised at once, and ``on_give_up`` gets a future done when the thread ends."""
        token = next(self._tokens)
        self._waiting[token] = self.clock()
        try:
            await self._slots.acquire()
        finally:
            del self._waiting[token]
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()
        call = _Call(loop.create_future())
        ctx = contextvars.copy_context()

        def body() -> None:
            _call_soon(loop, _settle, started, None)
            try:
                outcome: tuple[bool, Any] = (True, ctx.run(func, arg))
            except BaseException as exc:  # SystemExit, KeyboardInterrupt: the caller decides
                outcome = (False, exc)
            _call_soon(loop, self._finished, call, outcome)

        thread = threading.Thread(target=body, name=f"conveyor-handler-{next(_names)}", daemon=True)
        self._alive += 1
        try:
            thread.start()
        except BaseException:
            self._alive -= 1
            self._slots.release()
            raise
        try:
            await started
            try:
                async with asyncio.timeout(timeout):
                    ok, value = await asyncio.shield(call.done)
            except TimeoutError:
                if on_deadline is not None:
                    on_deadline()
                try:  # the work goes on: so does its slot
                    async with asyncio.timeout(give_up_after):
                        await asyncio.shield(call.done)
                except TimeoutError:
                    self._abandon(call)
                    if on_give_up is not None:
                        on_give_up(call.done)
                raise HandlerTimeout(f"attempt exceeded its timeout of {timeout} s") from None
        except BaseException:
            if not call.done.done() and not call.abandoned:
                self._abandon(call)
            raise
        if ok:
            return value
        raise value

    def _abandon(self, call: _Call) -> None:
        call.abandoned = True
        self._abandoned += 1

    def _finished(self, call: _Call, outcome: tuple[bool, Any]) -> None:
        self._alive -= 1
        if call.abandoned:
            self._abandoned -= 1
        self._slots.release()
        _settle(call.done, outcome)


def _settle(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
        loop.call_soon_threadsafe(fn, *args)
