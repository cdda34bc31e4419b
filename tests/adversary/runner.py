"""Real processes for the adversarial handlers: the API in the test's loop (real HTTP), ``conveyor
publisher`` (relay + maintenance) and ``conveyor worker --app tests.adversary.handlers:router``
as subprocesses, the worker restarted like Kubernetes would when it dies; and the neighbours'
throughput, measured from the database's own timestamps."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from conveyor.core.config import Settings

from .. import db as tdb
from ..faults.harness import Proc, WorkerFleet, component_env, conveyor_command
from ..stack import Stack, running_stack, wait_for

APP = "tests.adversary.handlers:router"
NEIGHBOURS = ("neighbour", "neighbour_sync")


@dataclass
class Rig:
    stack: Stack
    fleet: WorkerFleet
    publisher: Proc
    db_url: str
    started_in: float  # seconds the first workers took to start: a restart under this load

    async def submit(self, job_type: str, payloads: list[dict[str, Any]]) -> list[str]:
        body = {"jobs": [{"type": job_type, "payload": p} for p in payloads]}
        r = await self.stack.client.post("/jobs/batch", json=body)
        assert r.status_code == 201, r.text
        return [str(j["id"]) for j in r.json()["jobs"]]

    async def neighbour_rates(self, n: int = 7, sleep: float = 0.6) -> dict[str, float]:
        """Jobs per second of each neighbour type: ``n`` jobs of ``sleep`` seconds (one wave
        when one of the worker's 8 slots is taken), one type after the other; first submit to
        last finish on the database's clock. Neighbours that do not finish in 12 s raise."""
        rates = {}
        for t in NEIGHBOURS:
            batch = await self.submit(t, [{"sleep": sleep}] * n)
            await wait_for(self.db_url, batch, ["COMPLETED"], 12)
            conn = await tdb.connect(self.db_url)
            try:
                span = await conn.fetchval(
                    "SELECT extract(epoch FROM max(finished_at) - min(created_at))"
                    " FROM jobs WHERE id = ANY($1::uuid[])",
                    [uuid.UUID(i) for i in batch],
                )
            finally:
                await conn.close()
            rates[t] = round(n / float(span), 2)
        return rates

    async def warm_up(self) -> None:
        ids = [i for t in NEIGHBOURS for i in await self.submit(t, [{"sleep": 0}] * 8)]
        await wait_for(self.db_url, ids, ["COMPLETED"], 30)

    async def workers_up(self, timeout: float = 30.0) -> None:
        """Every worker slot alive and started (a dead one has been replaced)."""
        deadline = time.monotonic() + timeout
        while not all(p.alive() and "worker_started" in p.log() for p in self.fleet.slots):
            assert time.monotonic() < deadline, self.fleet.logs()
            await asyncio.sleep(0.1)

    async def job(self, job_id: str) -> asyncpg.Record:
        conn = await tdb.connect(self.db_url)
        try:
            return await conn.fetchrow(
                "SELECT status::text AS status, attempts, retry_count, max_retries, last_error,"
                " octet_length(result::text) AS result_bytes,"
                " (SELECT array_agg(error ORDER BY attempt) FROM job_attempts"
                "  WHERE job_id = jobs.id) AS attempt_errors"
                " FROM jobs WHERE id = $1",
                uuid.UUID(job_id),
            )
        finally:
            await conn.close()

    async def started(self, job_id: str, timeout: float = 20.0) -> None:
        await wait_for(
            self.db_url, [job_id], ["IN_PROGRESS", "RETRYING", "COMPLETED", "FAILED"], timeout
        )


@contextlib.asynccontextmanager
async def rig(
    settings: Settings,
    log_dir: Path,
    *,
    workers: int = 1,
    concurrency: int = 8,
    types: list[list[str] | None] | None = None,
    app: str = APP,
) -> AsyncIterator[Rig]:
    """``types``: each worker's job types (``--types``), e.g. an adversary on a process of its
    own and the neighbours on another; None: every worker runs every type."""
    t0 = time.monotonic()
    publisher = Proc(
        "publisher", [*conveyor_command(), "publisher"], component_env(settings), log_dir
    ).start()
    fleet = WorkerFleet(
        settings, log_dir, workers if types is None else len(types), concurrency=concurrency,
        app=app, types=types,
    )  # fmt: skip
    stop = asyncio.Event()
    supervisor: asyncio.Task[None] | None = None
    try:
        async with running_stack(settings, None, relays=0, maintenance=False) as stack:
            await publisher.wait_for_log("publisher_started", 30)
            await fleet.ready()
            started_in = time.monotonic() - t0
            supervisor = asyncio.create_task(fleet.supervise(stop))
            yield Rig(stack, fleet, publisher, settings.database_url, started_in)
    finally:
        stop.set()
        if supervisor is not None:
            await supervisor
        for p in [*fleet.slots, publisher]:
            await p.kill()
