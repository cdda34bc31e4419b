"""The middleware chain around one handler call (``router.middleware``).

Every middleware is ``async def mw(job, call_next)``; the innermost ``call_next`` runs the
handler: an async handler directly, a sync one in its thread (``threads.py``), so the same
middleware wraps both kinds. Registration order: the first registered is the outermost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..jobs.router import CallNext, Job, Middleware


def chain(middlewares: Sequence[Middleware], handler: CallNext) -> CallNext:
    """``handler`` wrapped in ``middlewares`` (returned unchanged when there are none, so a
    router without middleware pays nothing)."""
    call = handler
    for mw in reversed(middlewares):
        call = _wrap(mw, call)
    return call


def _wrap(mw: Middleware, call_next: CallNext) -> CallNext:
    def call(job: Job) -> Awaitable[Any]:
        return mw(job, call_next)

    return call


def sync_call(
    run: Callable[[Callable[[Job], Any], Job, float | None], Awaitable[Any]],
    func: Callable[[Job], Any],
    timeout: float | None,
) -> CallNext:
    """The innermost ``call_next`` of a sync handler: ``run`` (the thread runner) on ``func``."""

    def call(job: Job) -> Awaitable[Any]:
        return run(func, job, timeout)

    return call
