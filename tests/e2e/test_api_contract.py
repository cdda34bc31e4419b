"""The REST error contract over real HTTP: 422 / 413 / 409 / 404 / 503, never a 500,
never a partial write."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from conveyor.api.models import JobResource
from conveyor.core.config import Settings

from ..stack import Stack, running_stack


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    # no relay and no sweeper: the tests count the rows each request wrote, outbox included
    async with running_stack(settings, None, maintenance=False, relays=0) as s:
        yield s


async def _counts(db: asyncpg.Connection) -> tuple[int, int]:
    return (
        await db.fetchval("SELECT count(*) FROM jobs"),
        await db.fetchval("SELECT count(*) FROM job_outbox"),
    )


async def test_submit_returns_the_resource(stack: Stack, db: asyncpg.Connection) -> None:
    r = await stack.client.post(
        "/jobs",
        json={"type": "send_email", "payload": {"to": "x"}, "priority": "high", "max_retries": 7,
              "timeout_seconds": 12.5},
    )  # fmt: skip
    assert r.status_code == 201
    body = r.json()
    assert body["type"] == "send_email" and body["status"] == "PENDING"
    assert body["priority"] == 9 and body["max_retries"] == 7 and body["timeout_seconds"] == 12.5
    assert uuid.UUID(body["id"]) and body["created_at"]
    JobResource.model_validate(body)  # the documented schema is what is served
    got = await stack.client.get(f"/jobs/{body['id']}")
    assert got.status_code == 200 and got.json()["payload"] == {"to": "x"}
    assert await _counts(db) == (1, 1)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"type": "bad type"},
        {"type": "x" * 101},
        {"type": "t", "unknown": 1},
        {"type": "t", "payload": [1]},
        {"type": "t", "payload": "text"},
        {"type": "t", "priority": 10},
        {"type": "t", "priority": "urgent"},
        {"type": "t", "priority": True},
        {"type": "t", "max_retries": -1},
        {"type": "t", "timeout_seconds": 0},
        {"type": "t", "delay_seconds": -5},
        {"type": "t", "run_at": "2030-01-01T00:00:00"},  # no timezone
        {"type": "t", "run_at": "yesterday"},
        {"type": "t", "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 5},
        {"type": "t", "payload": {"nul": "\u0000"}},
    ],
)
async def test_invalid_bodies_are_422(stack: Stack, db: asyncpg.Connection, body: object) -> None:
    r = await stack.client.post("/jobs", json=body)
    assert r.status_code == 422, r.text
    assert "error" in r.json() and "Traceback" not in r.text
    assert await _counts(db) == (0, 0)


async def test_not_json_is_400(stack: Stack) -> None:
    r = await stack.client.post(
        "/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"] == "malformed_json"


async def test_oversized_payload_is_413_with_and_without_content_length(
    stack: Stack, db: asyncpg.Connection
) -> None:
    big = {"type": "t", "payload": {"blob": "x" * (300 * 1024)}}
    r = await stack.client.post("/jobs", json=big)
    assert r.status_code == 413 and r.json()["error"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"type": "t", "payload": {"blob": "'
        for _ in range(400):
            yield b"x" * 1024
        yield b'"}}'

    r = await stack.client.post(
        "/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    # a payload just over the limit inside a body under the body cap: still 413
    r = await stack.client.post("/jobs", json={"type": "t", "payload": {"b": "x" * (257 * 1024)}})
    assert r.status_code == 413
    assert await _counts(db) == (0, 0)


async def test_batch_is_all_or_none(stack: Stack, db: asyncpg.Connection) -> None:
    good = [{"type": "a", "payload": {"i": i}} for i in range(5)]
    r = await stack.client.post("/jobs/batch", json={"jobs": [*good, {"type": "bad type"}]})
    assert r.status_code == 422
    r = await stack.client.post(
        "/jobs/batch", json={"jobs": [*good, {"type": "a", "payload": {"b": "x" * (257 * 1024)}}]}
    )
    assert r.status_code == 413
    assert await _counts(db) == (0, 0)
    r = await stack.client.post("/jobs/batch", json={"jobs": good})
    assert r.status_code == 201
    jobs = r.json()["jobs"]
    assert [j["payload"]["i"] for j in jobs] == list(range(5))  # same order
    assert await _counts(db) == (5, 5)
    r = await stack.client.post("/jobs/batch", json={"jobs": [{"type": "a"}] * 1001})
    assert r.status_code == 422
    r = await stack.client.post("/jobs/batch", json={"jobs": []})
    assert r.status_code == 422


async def test_idempotency_key(stack: Stack, db: asyncpg.Connection) -> None:
    body = {"type": "charge", "payload": {"amount": 10}}
    h = {"Idempotency-Key": "order-42"}
    first = await stack.client.post("/jobs", json=body, headers=h)
    again = await stack.client.post("/jobs", json=body, headers=h)
    other = await stack.client.post("/jobs", json={**body, "payload": {"amount": 11}}, headers=h)
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert first.json()["id"] == again.json()["id"]
    assert await _counts(db) == (1, 1)


async def test_unknown_ids_are_404_and_bad_ids_422(stack: Stack) -> None:
    missing = uuid.uuid4()
    for method, path in (
        ("GET", f"/jobs/{missing}"),
        ("POST", f"/jobs/{missing}/cancel"),
        ("POST", f"/jobs/{missing}/retry"),
    ):
        r = await stack.client.request(method, path)
        assert r.status_code == 404, (path, r.text)
    # a path whose id is not a UUID names no job (and /jobs/batch is not a job id: 405)
    assert (await stack.client.get("/jobs/not-a-uuid")).status_code == 404


async def test_list_filters_and_keyset_pages(stack: Stack) -> None:
    r = await stack.client.post(
        "/jobs/batch",
        json={"jobs": [{"type": "a" if i % 2 else "b", "payload": {"i": i}} for i in range(25)]},
    )
    assert r.status_code == 201
    seen: list[str] = []
    cursor = None
    while True:
        params = {"type": "a", "limit": 5, **({"cursor": cursor} if cursor else {})}
        page = (await stack.client.get("/jobs", params=params)).json()
        seen += [j["id"] for j in page["jobs"]]
        assert all(j["type"] == "a" for j in page["jobs"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 12
    pending = (await stack.client.get("/jobs", params={"status": "PENDING", "limit": 100})).json()
    assert len(pending["jobs"]) == 25
    assert (await stack.client.get("/jobs", params={"status": "NOPE"})).status_code == 422
    assert (await stack.client.get("/jobs", params={"cursor": "%%%"})).status_code == 422
    assert (await stack.client.get("/jobs", params={"limit": 0})).status_code == 422


async def test_health_openapi_and_metrics(stack: Stack) -> None:
    assert (await stack.client.get("/healthz")).json() == {"status": "ok"}
    assert (await stack.client.get("/readyz")).status_code == 200
    spec = (await stack.client.get("/openapi.json")).json()
    assert {"/jobs", "/jobs/batch", "/jobs/{job_id}", "/jobs/{job_id}/cancel"} <= set(spec["paths"])
    assert (await stack.client.get("/docs")).status_code == 200
    await stack.client.post("/jobs", json={"type": "m"})
    metrics = (await stack.client.get("/metrics")).text
    assert 'conveyor_jobs_submitted_total{type="m"} 1.0' in metrics


async def test_database_down_is_503_within_two_seconds(settings: Settings) -> None:
    dead = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/none"})
    async with running_stack_api_only(dead) as client:
        for method, path, body in (
            ("POST", "/jobs", {"type": "t"}),
            ("POST", "/jobs/batch", {"jobs": [{"type": "t"}]}),
            ("GET", f"/jobs/{uuid.uuid4()}", None),
            ("GET", "/jobs", None),
            ("GET", "/readyz", None),
        ):
            t0 = time.monotonic()
            r = await client.request(method, path, json=body)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert time.monotonic() - t0 < 2.0
            assert r.json()["error"]
        assert (await client.get("/healthz")).status_code == 200


def running_stack_api_only(settings: Settings):  # type: ignore[no-untyped-def]
    import asyncio
    import contextlib

    from conveyor.cli.processes import api_server, serve_api

    from ..stack import free_port

    @contextlib.asynccontextmanager
    async def cm() -> AsyncIterator[httpx.AsyncClient]:
        port = free_port()
        server = api_server(settings, "127.0.0.1", port)
        stop = asyncio.Event()
        task = asyncio.create_task(serve_api(server, stop))
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            yield c
        stop.set()
        await task

    return cm()
