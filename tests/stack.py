"""A whole Conveyor in the test's event loop: the API on a real port (uvicorn, real HTTP), the
publisher, the sweeper and one or more workers. Used by integration and end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx

from conveyor import JobRouter
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper
from conveyor.publisher.relay import Relay
from conveyor.services import api_server, serve_api
from conveyor.worker.consumer import Worker

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    settings: Settings
    client: httpx.AsyncClient
    relay: Relay
    sweeper: Sweeper
    workers: list[Worker]
    stop: asyncio.Event
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def submit(self, job_type: str, payload: dict[str, Any] | None = None, **kw: Any) -> str:
        r = await self.client.post("/jobs", json={"type": job_type, "payload": payload or {}, **kw})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def add_worker(self, router: JobRouter, **kw: Any) -> Worker:
        w = Worker(self.settings, router, **kw)
        await w.start()
        self.workers.append(w)
        return w


async def wait_for(
    db_url: str,
    ids: Iterable[str | uuid.UUID],
    statuses: Iterable[str] = TERMINAL,
    timeout: float = 30.0,
) -> dict[uuid.UUID, str]:
    """Poll PostgreSQL until every job is in one of ``statuses``; returns id → status."""
    wanted = [uuid.UUID(str(i)) for i in ids]
    accept = set(statuses)
    conn = await asyncpg.connect(db_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            rows = await conn.fetch(
                "SELECT id, status::text AS s FROM jobs WHERE id = ANY($1::uuid[])", wanted
            )
            got = {r["id"]: r["s"] for r in rows}
            if len(got) == len(set(wanted)) and all(s in accept for s in got.values()):
                return got
            if time.monotonic() > deadline:
                late = {str(k): v for k, v in got.items() if v not in accept}
                raise AssertionError(f"{len(late)} jobs not in {accept} after {timeout}s: "
                                     f"{dict(list(late.items())[:5])}")  # fmt: skip
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def running_stack(
    settings: Settings,
    router: JobRouter | None = None,
    *,
    concurrency: int = 16,
    workers: int = 1,
    maintenance: bool = True,
) -> AsyncIterator[Stack]:
    stop = asyncio.Event()
    port = free_port()
    server = api_server(settings, "127.0.0.1", port)
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(serve_api(server, stop))]
    relay = Relay(settings)
    await relay.start()
    tasks.append(asyncio.create_task(relay.run(stop)))
    sweeper = Sweeper(settings)
    await sweeper.start()
    if maintenance:
        tasks.append(asyncio.create_task(sweeper.run(stop)))
    started: list[Worker] = []
    if router is not None:
        for _ in range(workers):
            w = Worker(settings, router, concurrency=concurrency)
            await w.start()
            started.append(w)
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("API did not start")
        await asyncio.sleep(0.01)
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30)
    stack = Stack(settings, client, relay, sweeper, started, stop, tasks)
    try:
        yield stack
    finally:
        await client.aclose()
        for w in stack.workers:
            with contextlib.suppress(Exception):
                await w.stop(grace=2)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        await relay.close()
        await sweeper.close()
