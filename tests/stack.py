"""A whole Conveyor in the test's event loop: the API on a real port (uvicorn, real HTTP), the
publisher, the sweeper and one or more workers. Used by integration and end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from conveyor import JobRouter
from conveyor.cli.processes import api_server, serve_api
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper
from conveyor.publisher.relay import Relay
from conveyor.worker import Worker

from . import db as tdb

S = TypeVar("S", bound="Stack")

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    settings: Settings
    client: httpx.AsyncClient
    relays: list[Relay]
    sweeper: Sweeper | None
    workers: list[Worker]
    stop: asyncio.Event
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @property
    def relay(self) -> Relay:
        return self.relays[0]

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
    schema: str = tdb.SCHEMA,
) -> dict[uuid.UUID, str]:
    """Poll PostgreSQL until every job is in one of ``statuses``; returns id → status."""
    wanted = [uuid.UUID(str(i)) for i in ids]
    accept = set(statuses)
    conn = await tdb.connect(db_url, schema=schema)
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
    routers: Sequence[JobRouter] = (),
    concurrency: int = 16,
    workers: int = 1,
    maintenance: bool = True,
    relays: int = 1,
    relay_setup: Callable[[Relay], Any] | None = None,
    stack_class: type[S] = Stack,  # type: ignore[assignment]
) -> AsyncIterator[S]:
    """The API (uvicorn on a free port), ``relays`` relays (each passed to ``relay_setup``, where
    a test injects faults from outside), the sweeper (``maintenance``) and ``workers`` workers
    for ``router`` plus one per ``routers``."""
    stop = asyncio.Event()
    port = free_port()
    server = api_server(settings, "127.0.0.1", port)
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(serve_api(server, stop))]
    started_relays: list[Relay] = []
    for _ in range(relays):
        relay = Relay(settings)
        if relay_setup is not None:
            relay_setup(relay)
        await relay.start()
        started_relays.append(relay)
        tasks.append(asyncio.create_task(relay.run(stop)))
    sweeper: Sweeper | None = None
    if maintenance:
        sweeper = Sweeper(settings)
        await sweeper.start()
        tasks.append(asyncio.create_task(sweeper.run(stop)))
    started: list[Worker] = []
    for r in [*([router] * workers if router is not None else []), *routers]:
        w = Worker(settings, r, concurrency=concurrency)
        await w.start()
        started.append(w)
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("API did not start")
        await asyncio.sleep(0.01)
    # keep-alive shorter than uvicorn's 5 s: a pooled connection the server is closing at that
    # very moment fails the next request with ReadError
    client = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=30, limits=httpx.Limits(keepalive_expiry=2)
    )
    stack = stack_class(settings, client, started_relays, sweeper, started, stop, tasks)
    try:
        yield stack
    finally:
        await client.aclose()
        for w in stack.workers:
            with contextlib.suppress(Exception):
                await w.stop(grace=2)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        for relay in started_relays:
            await relay.close()
        if sweeper is not None:
            await sweeper.close()
