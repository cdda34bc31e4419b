"""A Python client of the REST API, on httpx: ``Client`` (sync) and ``AsyncClient`` (asyncio).

    from conveyor.client import Client

    with Client("http://127.0.0.1:8000", api_key=None) as c:
        job = c.submit("resize", {"image": 42}, priority="high")
        done = c.wait(job.id, timeout=30)       # the finished job: COMPLETED, FAILED, CANCELLED
        print(done.status, done.result, done.error)

Errors are typed (``NotFound`` 404, ``Conflict`` 409, ``InvalidRequest`` 422, ``RateLimited``
429 with ``retry_after``, ``Unavailable`` 503, ``Unauthorized`` 401, ``Forbidden`` 403, all
``ApiError``). ``wait`` polls ``GET /jobs/{id}`` with a backoff from 50 ms to 1 s, so a short
job is seen within ~50 ms and a long one costs one request a second."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from .common import (
    TERMINAL,
    JobInfo,
    JobPage,
    _Backoff,
    _check,
    _headers,
    _idem,
    _list_params,
    _page,
    job_body,
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
)

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
    "job_body",
]


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
        self.http.headers.update(_headers(api_key))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def submit(
        self,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> JobInfo:
        """``options``: priority, max_retries, timeout_seconds, run_at, delay_seconds, meta,
        unique_for, unique_key (see ``job_body``)."""
        body = job_body(job_type, payload, **options)
        r = self.http.post("/jobs", json=body, headers=_idem(idempotency_key))
        return JobInfo.from_json(_check(r))

    def submit_batch(
        self, jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[JobInfo]:
        """``jobs``: bodies as ``job_body`` builds them; one transaction, same order."""
        r = self.http.post(
            "/jobs/batch", json={"jobs": [dict(j) for j in jobs]}, headers=_idem(idempotency_key)
        )
        return [JobInfo.from_json(j) for j in _check(r)["jobs"]]

    def get(self, job_id: uuid.UUID | str) -> JobInfo:
        return JobInfo.from_json(_check(self.http.get(f"/jobs/{job_id}")))

    def list(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        return _page(
            _check(self.http.get("/jobs", params=_list_params(type, status, limit, cursor)))
        )

    def cancel(self, job_id: uuid.UUID | str) -> JobInfo:
        return JobInfo.from_json(_check(self.http.post(f"/jobs/{job_id}/cancel")))

    def retry(self, job_id: uuid.UUID | str) -> JobInfo:
        return JobInfo.from_json(_check(self.http.post(f"/jobs/{job_id}/retry")))

    def wait(self, job_id: uuid.UUID | str, timeout: float = 60.0) -> JobInfo:
        """The job once COMPLETED, FAILED or CANCELLED (``result`` / ``error``); raises
        ``WaitTimeout`` after ``timeout`` seconds."""
        backoff = _Backoff(timeout)
        while True:
            job = self.get(job_id)
            if job.finished:
                return job
            sleep = backoff.next_sleep()
            if sleep is None:
                raise WaitTimeout(job, timeout)
            time.sleep(sleep)


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
        self.http.headers.update(_headers(api_key))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def submit(
        self,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> JobInfo:
        body = job_body(job_type, payload, **options)
        r = await self.http.post("/jobs", json=body, headers=_idem(idempotency_key))
        return JobInfo.from_json(_check(r))

    async def submit_batch(
        self, jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[JobInfo]:
        r = await self.http.post(
            "/jobs/batch", json={"jobs": [dict(j) for j in jobs]}, headers=_idem(idempotency_key)
        )
        return [JobInfo.from_json(j) for j in _check(r)["jobs"]]

    async def get(self, job_id: uuid.UUID | str) -> JobInfo:
        return JobInfo.from_json(_check(await self.http.get(f"/jobs/{job_id}")))

    async def list(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        r = await self.http.get("/jobs", params=_list_params(type, status, limit, cursor))
        return _page(_check(r))

    async def cancel(self, job_id: uuid.UUID | str) -> JobInfo:
        return JobInfo.from_json(_check(await self.http.post(f"/jobs/{job_id}/cancel")))

    async def retry(self, job_id: uuid.UUID | str) -> JobInfo:
        return JobInfo.from_json(_check(await self.http.post(f"/jobs/{job_id}/retry")))

    async def wait(self, job_id: uuid.UUID | str, timeout: float = 60.0) -> JobInfo:
        backoff = _Backoff(timeout)
        while True:
            job = await self.get(job_id)
            if job.finished:
                return job
            sleep = backoff.next_sleep()
            if sleep is None:
                raise WaitTimeout(job, timeout)
            await asyncio.sleep(sleep)
