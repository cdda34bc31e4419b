"""``JobRouter``: the registry of handlers a worker runs, and ``Job``, what a handler receives."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .core.jobs import check_type
from .schedules import CodeSchedule, code_schedule

Handler = Callable[["Job"], Any]
F = TypeVar("F", bound=Handler)


@dataclass
class Job:
    """One attempt of a job, as a handler sees it."""

    id: uuid.UUID
    type: str
    payload: dict[str, Any]
    attempt: int
    priority: int
    retry_count: int = 0
    max_retries: int = 0
    meta: dict[str, Any] = field(default_factory=dict)  # the submit's ``meta`` ({} when none)
    _cancel: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel this job (or the lease was lost): stop early; the
        attempt's result will be discarded."""
        return self._cancel.is_set()

    async def wait_cancelled(self) -> None:
        await self._cancel.wait()


@dataclass(frozen=True)
class HandlerSpec:
    job_type: str
    func: Handler
    is_async: bool
    max_retries: int | None = None
    retry_delays: tuple[float, ...] | None = None
    timeout: float | None = None

    def defaults(self) -> dict[str, float | int]:
        d: dict[str, float | int] = {}
        if self.max_retries is not None:
            d["max_retries"] = self.max_retries
        if self.timeout is not None:
            d["timeout"] = self.timeout
        return d


class JobRouter:
    """Collects handlers::

    router = JobRouter()

    @router.job("send_email", max_retries=5, retry_delays=[5, 30, 300], timeout=30)
    async def send_email(job: Job) -> dict | None: ...
    """

    def __init__(self) -> None:
        self.handlers: dict[str, HandlerSpec] = {}
        # ``schedule=`` / ``every=``: registered as schedules named after the type when a
        # worker starts (or ``conveyor types register``); see ``conveyor.schedule_ops``
        self.schedules: dict[str, CodeSchedule] = {}

    def job(
        self,
        job_type: str,
        *,
        max_retries: int | None = None,
        retry_delays: Sequence[float] | None = None,
        timeout: float | None = None,
        schedule: str | None = None,
        every: float | None = None,
        schedule_timezone: str = "UTC",
        catch_up: str = "skip",
    ) -> Callable[[F], F]:
        check_type(job_type)
        timed = code_schedule(schedule, every, schedule_timezone, catch_up)
        if max_retries is not None and max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if retry_delays is not None and (not retry_delays or any(d < 0 for d in retry_delays)):
            raise ValueError("retry_delays must be a non-empty list of seconds >= 0")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be > 0")

        def register(func: F) -> F:
            if job_type in self.handlers:
                raise ValueError(f"a handler for {job_type!r} is already registered")
            self.handlers[job_type] = HandlerSpec(
                job_type=job_type,
                func=func,
                is_async=inspect.iscoroutinefunction(func),
                max_retries=max_retries,
                retry_delays=tuple(retry_delays) if retry_delays is not None else None,
                timeout=timeout,
            )
            if timed is not None:
                self.schedules[job_type] = timed
            return func

        return register

    def include(self, other: JobRouter) -> None:
        for spec in other.handlers.values():
            if spec.job_type in self.handlers:
                raise ValueError(f"a handler for {spec.job_type!r} is already registered")
            self.handlers[spec.job_type] = spec
        self.schedules.update(other.schedules)

    @property
    def types(self) -> list[str]:
        return sorted(self.handlers)
