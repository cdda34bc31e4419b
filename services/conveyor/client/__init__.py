"""A Python client of the REST API, on httpx: ``Client`` (sync) and ``AsyncClient`` (asyncio).

    from conveyor.client import Client

    with Client("http://127.0.0.1:8000", api_key=None) as c:
        job = c.submit("resize", {"image": 42}, priority="high")
        done = c.wait(job.id, timeout=30)       # the finished job: COMPLETED, FAILED, CANCELLED
        print(done.status, done.result, done.error)

Workflows (jobs that wait for other jobs)::

    jobs = [workflow_job("fetch", "fetch_data"), workflow_job("report", "build", after=["fetch"])]
    wf = c.submit_workflow("nightly", jobs, idempotency_key="nightly-2026-11-25")
    done = c.wait_workflow(wf.id, timeout=600)   # COMPLETED, FAILED or CANCELLED

Errors are typed (``NotFound`` 404, ``Conflict`` 409, ``InvalidRequest`` 422, ``RateLimited``
429 with ``retry_after``, ``Unavailable`` 503, ``Unauthorized`` 401, ``Forbidden`` 403, all
``ApiError``). ``wait`` polls ``GET /jobs/{id}`` with a backoff from 50 ms to 1 s, so a short
job is seen within ~50 ms and a long one costs one request a second."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import httpx

from . import common
from .common import (
    TERMINAL,
    Call,
    JobInfo,
    JobPage,
    WorkflowInfo,
    WorkflowPage,
    job_body,
    workflow_job,
)
from .errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    Unavailable,
    WaitTimeout,
    check,
)

T = TypeVar("T")
FIRST_POLL = 0.05
MAX_POLL = 1.0
POLL_GROWTH = 1.5

__all__ = [
    "TERMINAL",
    "ApiError",
    "AsyncClient",
    "BadRequest",
    "Client",
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "JobInfo",
    "JobPage",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "WorkflowInfo",
    "WorkflowPage",
    "job_body",
    "workflow_job",
]


class _Poll:
    """``wait``'s pace: every ``FIRST_POLL`` seconds, growing to ``MAX_POLL``, for ``timeout``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.delay = FIRST_POLL

    def next_sleep(self, job: JobInfo | WorkflowInfo) -> float:
        """Seconds to wait before polling again; ``WaitTimeout`` (``job``: as last seen) after."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(job, self.timeout)
        sleep = min(self.delay, left)
        self.delay = min(self.delay * POLL_GROWTH, MAX_POLL)
        return sleep


class Client:
    """Synchronous client. ``http`` (an ``httpx.Client``) may be given, e.g. with a transport."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 10.0,
        http: httpx.Client | None = None,
    ) -> None:
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self.http.headers.update(common.auth_headers(api_key))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _send(self, call: Call[T]) -> T:
        return call.read(check(self.http.request(call.method, call.url, **call.options)))

    def submit(
        self,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> JobInfo:
        """``options``: priority, max_retries, timeout_seconds, run_at, delay_seconds, meta,
        unique_for, unique_key, partition_key, debounce_seconds, debounce_max_seconds,
        debounce_key (see ``job_body``)."""
        return self._send(common.submit(job_type, payload, idempotency_key, options))

    def submit_batch(
        self, jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[JobInfo]:
        """``jobs``: bodies as ``job_body`` builds them; one transaction, same order."""
        return self._send(common.submit_batch(jobs, idempotency_key))

    def get(self, job_id: uuid.UUID | str) -> JobInfo:
        return self._send(common.get(job_id))

    def list(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        return self._send(common.list_jobs(type, status, limit, cursor))

    def cancel(self, job_id: uuid.UUID | str) -> JobInfo:
        return self._send(common.act(job_id, "cancel"))

    def retry(self, job_id: uuid.UUID | str) -> JobInfo:
        return self._send(common.act(job_id, "retry"))

    def wait(self, job_id: uuid.UUID | str, timeout: float = 60.0) -> JobInfo:
        """The job once COMPLETED, FAILED or CANCELLED (``result`` / ``error``); raises
        ``WaitTimeout`` after ``timeout`` seconds."""
        poll = _Poll(timeout)
        while not (job := self.get(job_id)).finished:
            time.sleep(poll.next_sleep(job))
        return job

    def submit_workflow(
        self,
        name: str,
        jobs: Iterable[Mapping[str, Any]],
        *,
        on_failure: str = "cancel",
        idempotency_key: str | None = None,
    ) -> WorkflowInfo:
        """``jobs``: as ``workflow_job`` builds them; all or none (422 for a cycle, an unknown
        or duplicate key, an invalid job)."""
        return self._send(common.submit_workflow(name, jobs, on_failure, idempotency_key))

    def get_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowInfo:
        return self._send(common.get_workflow(workflow_id))

    def list_workflows(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> WorkflowPage:
        return self._send(common.list_workflows(status, name, limit, cursor))

    def cancel_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowInfo:
        return self._send(common.cancel_workflow(workflow_id))

    def wait_workflow(self, workflow_id: uuid.UUID | str, timeout: float = 60.0) -> WorkflowInfo:
        """The workflow once COMPLETED, FAILED or CANCELLED; raises ``WaitTimeout`` after
        ``timeout`` seconds."""
        poll = _Poll(timeout)
        while not (wf := self.get_workflow(workflow_id)).finished:
            time.sleep(poll.next_sleep(wf))
        return wf


class AsyncClient:
    """The same operations, awaitable."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 10.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self.http.headers.update(common.auth_headers(api_key))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _send(self, call: Call[T]) -> T:
        return call.read(check(await self.http.request(call.method, call.url, **call.options)))

    async def submit(
        self,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> JobInfo:
        return await self._send(common.submit(job_type, payload, idempotency_key, options))

    async def submit_batch(
        self, jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[JobInfo]:
        return await self._send(common.submit_batch(jobs, idempotency_key))

    async def get(self, job_id: uuid.UUID | str) -> JobInfo:
        return await self._send(common.get(job_id))

    async def list(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        return await self._send(common.list_jobs(type, status, limit, cursor))

    async def cancel(self, job_id: uuid.UUID | str) -> JobInfo:
        return await self._send(common.act(job_id, "cancel"))

    async def retry(self, job_id: uuid.UUID | str) -> JobInfo:
        return await self._send(common.act(job_id, "retry"))

    async def wait(self, job_id: uuid.UUID | str, timeout: float = 60.0) -> JobInfo:
        poll = _Poll(timeout)
        while not (job := await self.get(job_id)).finished:  # noqa: ASYNC110 (polls the API)
            await asyncio.sleep(poll.next_sleep(job))
        return job

    async def submit_workflow(
        self,
        name: str,
        jobs: Iterable[Mapping[str, Any]],
        *,
        on_failure: str = "cancel",
        idempotency_key: str | None = None,
    ) -> WorkflowInfo:
        return await self._send(common.submit_workflow(name, jobs, on_failure, idempotency_key))

    async def get_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowInfo:
        return await self._send(common.get_workflow(workflow_id))

    async def list_workflows(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> WorkflowPage:
        return await self._send(common.list_workflows(status, name, limit, cursor))

    async def cancel_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowInfo:
        return await self._send(common.cancel_workflow(workflow_id))

    async def wait_workflow(
        self, workflow_id: uuid.UUID | str, timeout: float = 60.0
    ) -> WorkflowInfo:
        poll = _Poll(timeout)
        while not (wf := await self.get_workflow(workflow_id)).finished:  # noqa: ASYNC110
            await asyncio.sleep(poll.next_sleep(wf))
        return wf
