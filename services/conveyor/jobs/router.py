"""``JobRouter``: the registry of handlers a worker runs, and ``Job``, what a handler receives."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, Unpack

from ..core.jobs import JobOptions, check_type
from ..core.limits import Partitioning, Rate, check_concurrency, parse_rate, partitioning
from .schedules import CodeSchedule, code_schedule

Handler = Callable[["Job"], Any]
F = TypeVar("F", bound=Handler)
CallNext = Callable[["Job"], Awaitable[Any]]
Middleware = Callable[["Job", CallNext], Awaitable[Any]]
M = TypeVar("M", bound=Middleware)


class Ready:
    """What ``job.set_progress`` returns: awaitable (async handlers may ``await`` it) but already
    done, so a sync handler can ignore it."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


class JobId(uuid.UUID):
    """What ``job.enqueue`` returns: the new job's id, which ``await`` also gives back."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, uuid.UUID]:
        return self._value()

    def _value(self) -> Generator[Any, None, uuid.UUID]:
        return self
        yield  # pragma: no cover - makes this a generator


class JobHooks(Protocol):
    """The worker's side of ``Job.set_progress`` and ``Job.enqueue`` (``worker/jobctx.py``)."""

    def progress(self, job: Job, percent: float, message: str | None) -> None: ...
    def enqueue(
        self, job: Job, job_type: str, payload: Any, options: dict[str, Any]
    ) -> uuid.UUID: ...


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
    workflow_id: uuid.UUID | None = None  # None: not a workflow's job
    # a workflow job's dependencies by key: {"status": ..., "result": ...} (``parents``)
    dependencies: dict[str, dict[str, Any]] = field(default_factory=dict)
    _cancel: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _hooks: JobHooks | None = field(default=None, repr=False)

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel this job (or the lease was lost): stop early; the
        attempt's result will be discarded."""
        return self._cancel.is_set()

    @property
    def parents(self) -> dict[str, Any]:
        """Each dependency's result by its key in the workflow. Under ``on_failure="continue"``
        a dependency that did not complete shows None: ``parent_statuses`` says why."""
        return {k: d["result"] for k, d in self.dependencies.items()}

    @property
    def parent_statuses(self) -> dict[str, str]:
        """Each dependency's status (COMPLETED, FAILED or CANCELLED) by its key."""
        return {k: d["status"] for k, d in self.dependencies.items()}

    async def wait_cancelled(self) -> None:
        await self._cancel.wait()

    def set_progress(self, percent: float, message: str | None = None) -> Ready:
        """Report progress (0-100, with an optional message) for ``GET /jobs/{id}``. Cheap: the
        worker writes at most one value per job every 0.5 s (the last one wins), fenced by this
        attempt. ``await`` it in async handlers or just call it (sync handlers, any thread)."""
        if self._hooks is not None:
            self._hooks.progress(self, percent, message)
        return Ready()

    def enqueue(self, job_type: str, payload: Any = None, **options: Unpack[JobOptions]) -> JobId:
        """A follow-up job, committed in the same transaction as this attempt's COMPLETED
        transition and only if the attempt completes. Options as ``conveyor.enqueue``. Returns
        the new job's id (also when awaited). Raises ``UnknownJobType`` / ``InvalidJob`` now."""
        if self._hooks is None:
            raise RuntimeError("job.enqueue works inside a handler run by a worker")
        return JobId(int=self._hooks.enqueue(self, job_type, payload, dict(options)).int)


@dataclass(frozen=True)
class HandlerSpec:
    job_type: str
    func: Handler
    is_async: bool
    max_retries: int | None = None
    retry_delays: tuple[float, ...] | None = None
    timeout: float | None = None
    concurrency: int | None = None  # fleet-wide: at most this many IN_PROGRESS
    rate: Rate | None = None  # fleet-wide: at most this many starts per window
    weight: int | None = None  # this type's share of a worker's concurrency
    partition: Partitioning | None = None  # per-key limits (admission)

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
        self.middlewares: list[Middleware] = []
        # ``schedule=`` / ``every=``: registered as schedules named after the type when a
        # worker starts (or ``conveyor types register``); see ``conveyor.jobs.types``
        self.schedules: dict[str, CodeSchedule] = {}

    def middleware(self, func: M) -> M:
        """Register ``async def mw(job, call_next)`` around every handler call (async and sync
        handlers alike; ``await call_next(job)`` runs the rest of the chain and returns the
        handler's result). Applied in registration order: the first registered is outermost.
        What a middleware raises is the attempt's failure, as if the handler had raised it."""
        registered: Middleware = func
        if not inspect.iscoroutinefunction(registered):
            raise TypeError("middleware must be an async function (job, call_next)")
        self.middlewares.append(registered)
        return func

    def job(
        self,
        job_type: str,
        *,
        max_retries: int | None = None,
        retry_delays: Sequence[float] | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
        rate_limit: str | None = None,
        weight: int | None = None,
        partition_by: str | Sequence[str] | None = None,
        partition_concurrency: int | None = None,
        partition_rate_limit: str | None = None,
        ordered: bool | str = False,
        schedule: str | None = None,
        every: float | None = None,
        schedule_timezone: str = "UTC",
        catch_up: str = "skip",
    ) -> Callable[[F], F]:
        """``concurrency`` and ``rate_limit`` (``"100/m"``) hold across all workers (operators can
        change them at run time: ``conveyor types limit``); ``weight`` is this type's share of
        the ``--concurrency`` of a worker that runs several types.

        Per partition key (a payload field, a tuple of fields, or the submit's
        ``partition_key``): ``partition_concurrency`` jobs of one key at once,
        ``partition_rate_limit`` starts of one key per window, ``ordered`` (one at a time, in the
        order the submits committed; ``True`` or ``"hold"``: a FAILED job holds its key until it
        is retried or cancelled, ``"continue"``: the next job goes on)."""
        check_type(job_type)
        check_concurrency(concurrency)
        check_concurrency(partition_concurrency)
        rate = parse_rate(rate_limit) if rate_limit is not None else None
        partition = partitioning(partition_by, partition_concurrency, partition_rate_limit, ordered)
        if weight is not None and (not isinstance(weight, int) or not 1 <= weight <= 1000):
            raise ValueError("weight must be an integer from 1 to 1000")
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
                concurrency=concurrency,
                rate=rate,
                weight=weight,
                partition=partition,
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
        self.middlewares.extend(m for m in other.middlewares if m not in self.middlewares)
        self.schedules.update(other.schedules)

    @property
    def types(self) -> list[str]:
        return sorted(self.handlers)
