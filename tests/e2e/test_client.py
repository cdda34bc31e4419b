"""``conveyor.client``: ``AsyncClient`` and ``Client`` against the real stack (submit, batch,
get, list, cancel, retry, wait for a result or an error), typed errors from real answers (404,
409, 422, 503) and from a stub transport for the statuses this branch's API cannot give yet
(401, 403, 429 with Retry-After)."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import httpx
import pytest

from conveyor import Job, JobRouter
from conveyor.cli.processes import api_server, serve_api
from conveyor.client import (
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
    WaitTimeout,
    job_body,
)
from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types

from ..stack import free_port, running_stack

router = JobRouter()


@router.job("client_square")
async def square(job: Job) -> dict[str, int]:
    await asyncio.sleep(job.payload.get("sleep", 0))
    return {"square": job.payload["n"] ** 2}


@router.job("client_keyed", partition_by="account", partition_concurrency=1)
async def keyed(job: Job) -> None:
    await asyncio.sleep(job.payload.get("sleep", 0))


@router.job("client_fail", max_retries=0)
def fail(job: Job) -> None:
    raise ValueError("no such recipient")


async def _register(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await register_router_types(conn, router)
        await conn.execute("INSERT INTO conveyor.job_types (name) VALUES ('client_idle')")
    finally:
        await conn.close()


async def test_async_client_against_the_stack(settings: Settings) -> None:
    await _register(settings.database_url)
    async with running_stack(settings, router) as stack:
        base = str(stack.client.base_url)
        async with AsyncClient(base) as c:
            job = await c.submit("client_square", {"n": 7}, priority="high", meta={"who": "t"})
            assert job.status in ("PENDING", "IN_PROGRESS", "COMPLETED") and job.meta == {
                "who": "t"
            }
            done = await c.wait(job.id, timeout=20)
            assert done.status == "COMPLETED" and done.result == {"square": 49}
            failed = await c.wait((await c.submit("client_fail")).id, timeout=20)
            assert failed.status == "FAILED" and failed.error == "ValueError: no such recipient"
            batch = await c.submit_batch(
                [job_body("client_square", {"n": i}) for i in range(3)], idempotency_key="b1"
            )
            again = await c.submit_batch(
                [job_body("client_square", {"n": i}) for i in range(3)], idempotency_key="b1"
            )
            assert [j.id for j in again] == [j.id for j in batch]
            results = [await c.wait(j.id, timeout=20) for j in batch]
            assert [r.result["square"] for r in results] == [0, 1, 4]
            unique = [await c.submit("client_idle", {"u": 1}, unique_for=60) for _ in range(2)]
            assert unique[1].duplicate is True and unique[1].id == unique[0].id
            page = await c.list(type="client_square", limit=2)
            assert len(page.jobs) == 2 and page.next_cursor is not None
            rest = await c.list(type="client_square", limit=10, cursor=page.next_cursor)
            assert len(rest.jobs) == 2
            # cancel, then retry a cancelled job; 409 for what the status forbids
            idle = await c.submit("client_idle")
            assert (await c.cancel(idle.id)).status == "CANCELLED"
            with pytest.raises(Conflict) as conflict:
                await c.cancel(idle.id)
            assert conflict.value.error == "invalid_transition"
            assert (await c.retry(idle.id)).status == "PENDING"
            with pytest.raises(NotFound):
                await c.get(uuid.uuid4())
            with pytest.raises(InvalidRequest) as invalid:
                await c.submit("client_square", {"n": 1}, priority="urgent")
            assert invalid.value.status == 422
            with pytest.raises(InvalidRequest):
                await c.submit("nobody_has_this_type")
            # wait gives up after its timeout, without polling faster than needed
            requests: list[float] = []
            c.http.event_hooks["request"] = [_recorder(requests)]
            started = time.monotonic()
            with pytest.raises(WaitTimeout) as late:
                await c.wait(idle.id, timeout=2.0)
            assert 2.0 <= time.monotonic() - started < 3.5
            assert late.value.job.status == "PENDING"
            assert 5 <= len(requests) <= 12, len(requests)


async def test_the_client_sends_partition_keys_and_debounces(settings: Settings) -> None:
    """The client's submits take the admission options, and its jobs show why they wait."""
    await _register(settings.database_url)
    async with (
        running_stack(settings, router) as stack,
        AsyncClient(str(stack.client.base_url)) as c,
    ):
        first = await c.submit("client_keyed", {"account": "a", "sleep": 3})
        given = await c.submit("client_keyed", {}, partition_key="a")
        assert (first.partition_key, given.partition_key) == ("a", "a")
        deadline = time.monotonic() + 10
        while (await c.get(given.id)).waiting_for != "partition_limit":  # the first one runs
            assert time.monotonic() < deadline, await c.get(given.id)
            await asyncio.sleep(0.1)
        d1 = await c.submit("client_keyed", {"account": "b", "v": 1}, debounce_seconds=30)
        d2 = await c.submit("client_keyed", {"account": "b", "v": 2}, debounce_seconds=30)
        assert (d1.debounced, d2.debounced, d2.id, d2.payload) == (False, True, d1.id, {
            "account": "b", "v": 2})  # fmt: skip
        assert (await c.get(d1.id)).waiting_for == "run_at"


def _recorder(into: list[float]):  # type: ignore[no-untyped-def]
    async def hook(request: httpx.Request) -> None:
        into.append(time.monotonic())

    return hook


async def test_sync_client_in_a_thread(settings: Settings) -> None:
    await _register(settings.database_url)
    async with running_stack(settings, router) as stack:
        base = str(stack.client.base_url)

        def use() -> tuple[object, ...]:
            with Client(base) as c:
                job = c.submit("client_square", {"n": 3, "sleep": 0.3})
                done = c.wait(job.id, timeout=20)
                with pytest.raises(NotFound):
                    c.cancel(uuid.uuid4())
                return done.status, done.result, c.get(job.id).attempts

        assert await asyncio.to_thread(use) == ("COMPLETED", {"square": 9}, 1)


async def test_unavailable_database_is_a_typed_503(settings: Settings) -> None:
    dead = settings.model_copy(
        update={"database_url": f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"}
    )
    port = free_port()
    server = api_server(dead, "127.0.0.1", port)
    stop = asyncio.Event()
    task = asyncio.create_task(serve_api(server, stop))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with AsyncClient(f"http://127.0.0.1:{port}") as c:
            with pytest.raises(Unavailable) as exc:
                await c.get(uuid.uuid4())
            assert exc.value.error == "service_unavailable"
    finally:
        stop.set()
        await task


def test_auth_header_and_the_statuses_of_keys_and_quotas() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        status = {"/jobs/a": 401, "/jobs/b": 403, "/jobs/c": 429}[request.url.path]
        headers = {"Retry-After": "7"} if status == 429 else {}
        return httpx.Response(status, json={"error": "e", "detail": "d"}, headers=headers)

    http = httpx.Client(base_url="http://x", transport=httpx.MockTransport(answer))
    with Client("http://x", api_key="k-123", http=http) as c:
        with pytest.raises(Unauthorized):
            c.get("a")
        with pytest.raises(Forbidden):
            c.get("b")
        with pytest.raises(RateLimited) as limited:
            c.get("c")
    assert limited.value.retry_after == 7.0
    assert seen == ["Bearer k-123"] * 3
