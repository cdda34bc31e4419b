"""``router.middleware``: wrappers around every handler call, async and sync, in registration
order; what a middleware raises is the attempt's failure."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from conveyor import CallNext, Job, JobRouter, Retry
from conveyor.core.metrics import Metrics
from conveyor.worker.executor import Executor
from conveyor.worker.outcomes import Kind
from conveyor.worker.running import Running


def _run(router: JobRouter, job_type: str, timeout: float | None = None) -> Any:
    job = Job(uuid.uuid4(), job_type, {"n": 1}, 1, 5, 0, 0)
    running = Running(job, router.handlers[job_type], timeout, time.monotonic())
    ex = Executor(Metrics(), concurrency=2, abandoned_limit=1, report=lambda r, o: None,
                  middlewares=router.middlewares)  # fmt: skip
    return ex.attempt(running)


def _traced(router: JobRouter, trace: list[str]) -> None:
    @router.middleware
    async def outer(job: Job, call_next: CallNext) -> Any:
        trace.append(f"outer-in:{job.type}")
        result = await call_next(job)
        trace.append("outer-out")
        return {"outer": result}

    @router.middleware
    async def inner(job: Job, call_next: CallNext) -> Any:
        trace.append("inner-in")
        result = await call_next(job)
        trace.append("inner-out")
        return {"inner": result}


async def test_middleware_wraps_async_handlers_in_registration_order() -> None:
    router, trace = JobRouter(), []  # type: list[str]

    @router.job("a")
    async def a(job: Job) -> int:
        trace.append("handler")
        return 1

    _traced(router, trace)
    outcome = await _run(router, "a")
    assert outcome.kind is Kind.COMPLETE
    assert outcome.result_json == '{"outer":{"inner":1}}'
    assert trace == ["outer-in:a", "inner-in", "handler", "inner-out", "outer-out"]


async def test_middleware_wraps_sync_handlers_which_still_run_in_a_thread() -> None:
    router, trace = JobRouter(), []  # type: list[str]
    loop_thread = threading.get_ident()

    @router.job("s")
    def s(job: Job) -> bool:
        trace.append("handler")
        return threading.get_ident() != loop_thread

    _traced(router, trace)
    outcome = await _run(router, "s")
    assert outcome.result_json == '{"outer":{"inner":true}}'  # the handler ran off the loop
    assert trace == ["outer-in:s", "inner-in", "handler", "inner-out", "outer-out"]


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_an_exception_in_middleware_is_the_attempts_failure(kind: str) -> None:
    router, ran = JobRouter(), []  # type: list[str]

    async def h(job: Job) -> None:
        ran.append("h")

    def hs(job: Job) -> None:
        ran.append("h")

    router.job("t", max_retries=0)(h if kind == "async" else hs)

    @router.middleware
    async def refuses(job: Job, call_next: CallNext) -> Any:
        raise PermissionError("tenant suspended")

    outcome = await _run(router, "t")
    assert outcome.kind is Kind.FAIL and outcome.delay is None  # FAILED: no retry left
    assert "PermissionError: tenant suspended" in (outcome.error or "")
    assert ran == []  # the chain stopped there


async def test_middleware_sees_the_handlers_exception_and_retry_keeps_its_meaning() -> None:
    router, seen = JobRouter(), []  # type: list[str]

    @router.job("t", max_retries=3)
    async def h(job: Job) -> None:
        raise ValueError("bad input")

    @router.job("r")
    async def r(job: Job) -> None:
        raise Retry(delay=5)

    @router.middleware
    async def report(job: Job, call_next: CallNext) -> Any:
        try:
            return await call_next(job)
        except Exception as exc:
            seen.append(type(exc).__name__)
            raise

    failed = await _run(router, "t")
    assert failed.kind is Kind.FAIL and failed.consume and "ValueError: bad input" in failed.error
    snoozed = await _run(router, "r")
    assert snoozed.kind is Kind.FAIL and not snoozed.consume and snoozed.delay == 5
    assert seen == ["ValueError", "Retry"]


async def test_the_async_timeout_covers_the_whole_chain() -> None:
    import asyncio

    router = JobRouter()

    @router.job("t", max_retries=0)
    async def h(job: Job) -> None:
        return None

    @router.middleware
    async def slow(job: Job, call_next: CallNext) -> Any:
        await asyncio.sleep(5)
        return await call_next(job)

    outcome = await _run(router, "t", timeout=0.1)
    assert outcome.kind is Kind.FAIL and "exceeded its timeout" in (outcome.error or "")


def test_middleware_must_be_async() -> None:
    router = JobRouter()
    with pytest.raises(TypeError):
        router.middleware(lambda job, call_next: call_next(job))  # type: ignore[arg-type,return-value]
