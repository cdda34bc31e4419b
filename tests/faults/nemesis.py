"""The nemesis: two publishers that die between publish confirm and outbox delete
(``crashing_publisher``), two sweepers, two workers running audited and adversarial handlers,
all real processes restarted when they die (like Kubernetes would); the API in the test's loop.
While jobs stream in, a chaos loop SIGKILLs workers, submits bursts of misbehaving jobs and,
when given private services, drops RabbitMQ's connections, restarts it, purges the work queue,
and crashes PostgreSQL. Then the checker."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from conveyor.core.config import Settings

from .. import db as tdb
from ..stack import running_stack
from .checker import Ledger
from .harness import Proc, WorkerFleet, component_env, conveyor_command, purge, topology
from .infra import PrivatePostgres, PrivateRabbit

APP = "tests.faults.nemesis_app:router"
# the smoke's adversaries (quick ones); the soak takes all of them through NEMESIS_ADVERSARIES
DEFAULT_ADVERSARIES = ("not_json", "times_out", "os_exit")


@dataclass
class Nemesis:
    settings: Settings
    log_dir: Path
    ledger: Ledger
    rng: random.Random
    adversaries: tuple[str, ...] = DEFAULT_ADVERSARIES
    rabbit: PrivateRabbit | None = None
    pg: PrivatePostgres | None = None
    crash_p: float = 0.05
    chaos_every: tuple[float, float] = (1.5, 4.0)  # seconds between faults
    accepted: list[str] = field(default_factory=list)
    adversarial: list[str] = field(default_factory=list)
    refused: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    procs: list[Proc] = field(default_factory=list)
    restarts: int = 0

    # ------------------------------------------------------------------ processes

    def _start_services(self) -> WorkerFleet:
        env = component_env(self.settings, FAULTS_CRASH_P=str(self.crash_p))
        publisher = [sys.executable, "-m", "tests.faults.crashing_publisher"]
        for i in (1, 2):
            self.procs.append(Proc(f"publisher-{i}", publisher, env, self.log_dir).start())
            sweeper = [*conveyor_command(), "sweeper"]
            self.procs.append(Proc(f"sweeper-{i}", sweeper, env, self.log_dir).start())
        return WorkerFleet(self.settings, self.log_dir, 2, concurrency=6, app=APP)

    async def _supervise(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for p in self.procs:
                if not p.alive():
                    self.restarts += 1
                    p.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    # ------------------------------------------------------------------ load and chaos

    async def _post(self, client: httpx.AsyncClient, jobs: list[dict[str, Any]]) -> list[str]:
        try:
            r = await client.post("/jobs/batch", json={"jobs": jobs})
        except httpx.HTTPError:
            r = None
        if r is None or r.status_code != 201:  # not accepted: not the checker's business
            self.refused += len(jobs)
            return []
        ids = [str(j["id"]) for j in r.json()["jobs"]]
        self.accepted += ids
        return ids

    async def _submit(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sleep = round(self.rng.uniform(0.02, 0.3), 3)
            work = {"type": "work", "payload": {"ledger": str(self.ledger), "sleep": sleep}}
            await self._post(client, [work] * 8)
            if self.adversaries and self.rng.random() < 0.2:
                await self._adversary(client, 1)
            await asyncio.sleep(0.5)

    async def _adversary(self, client: httpx.AsyncClient, n: int) -> None:
        jobs = [{"type": self.rng.choice(self.adversaries), "payload": {}} for _ in range(n)]
        self.adversarial += await self._post(client, jobs)

    async def _chaos(
        self, fleet: WorkerFleet, client: httpx.AsyncClient, stop: asyncio.Event
    ) -> None:
        menu = ["sigkill"] * 2 + (["adversary_burst"] if self.adversaries else [])
        if self.rabbit is not None:
            menu += ["close_connections", "broker_restart", "purge_work_queue"]
        if self.pg is not None:
            menu += ["postgres_restart"]
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(*self.chaos_every))
            if stop.is_set():
                return
            fault = self.rng.choice(menu)
            self.faults[fault] += 1
            if fault == "sigkill":
                # only once every worker is up: on a loaded machine a worker takes seconds to
                # start, and killing it before it runs anything tests nothing
                if all("worker_started" in p.log() for p in fleet.slots):
                    await fleet.kill_one(self.rng)
            elif fault == "adversary_burst":
                await self._adversary(client, 3)
            elif fault == "close_connections" and self.rabbit is not None:
                await asyncio.to_thread(self.rabbit.close_all_connections, "nemesis")
            elif fault == "broker_restart" and self.rabbit is not None:
                await asyncio.to_thread(self.rabbit.restart, self.rng.uniform(0.5, 2.0))
            elif fault == "purge_work_queue":
                with contextlib.suppress(Exception):
                    await purge(self.settings.amqp_url, topology(self.settings).work_queue("work"))
            elif fault == "postgres_restart" and self.pg is not None:
                await asyncio.to_thread(self.pg.restart, self.rng.uniform(0.5, 2.0))

    # ------------------------------------------------------------------ the run

    @contextlib.asynccontextmanager
    async def running(self, seconds: float) -> AsyncIterator[WorkerFleet]:
        """Run the load and the chaos for ``seconds``; yields the fleet with everything still
        running (for the checker), then stops every process."""
        fleet = self._start_services()
        stop, quiet = asyncio.Event(), asyncio.Event()
        try:
            async with running_stack(self.settings, None, relays=0, maintenance=False) as stack:
                await fleet.ready(60)
                tasks = [
                    asyncio.create_task(fleet.supervise(quiet)),
                    asyncio.create_task(self._supervise(quiet)),
                ]
                load = [
                    asyncio.create_task(self._submit(stack.client, stop)),
                    asyncio.create_task(self._chaos(fleet, stack.client, stop)),
                ]
                await asyncio.sleep(seconds)
                stop.set()
                await asyncio.gather(*load)
                yield fleet
                quiet.set()
                await asyncio.gather(*tasks)
        finally:
            quiet.set()
            for p in [*fleet.slots, *self.procs]:
                await p.kill()

    async def over_budget(self) -> list[str]:
        """Jobs that used more attempts than ``max_retries + 1`` (none of these handlers
        snoozes, and nothing drains: every attempt but the last consumed a retry)."""
        conn = await tdb.connect(self.settings.database_url)
        try:
            rows = await conn.fetch(
                "SELECT id::text, job_type, attempts, max_retries FROM jobs"
                " WHERE max_retries IS NOT NULL AND attempts > max_retries + 1"
            )
        finally:
            await conn.close()
        return [f"{r['id']} {r['job_type']} attempts={r['attempts']}" for r in rows]

    async def statuses(self, ids: list[str]) -> Counter[str]:
        conn = await tdb.connect(self.settings.database_url)
        try:
            rows = await conn.fetch(
                "SELECT status::text AS s FROM jobs WHERE id = ANY($1::uuid[])", ids
            )
        finally:
            await conn.close()
        return Counter(r["s"] for r in rows)
