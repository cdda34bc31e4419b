"""The setup the hand tests share (``test_frozen_hand``, ``test_hand_fairness``): the stack's
API, relay and sweeper in the test's loop, no worker of its own, and worker processes of
``hand_app`` started one by one, every one of them resumed and stopped at the end. Kept apart
from ``hand_app``, which each worker process imports: the harness would only slow its start."""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types

from ..stack import Stack, running_stack
from .hand_app import router
from .harness import Proc, worker_proc

APP = "tests.faults.hand_app:router"


@dataclass
class HandFleet:
    settings: Settings
    stack: Stack
    log_dir: Path
    ledger: str
    procs: list[Proc] = field(default_factory=list)

    async def worker(self, name: str, settings: Settings | None = None) -> Proc:
        """A worker process of two slots (the type's limit), started and logged as such."""
        proc = worker_proc(
            settings or self.settings, self.log_dir, name, concurrency=2, app=APP
        ).start()
        self.procs.append(proc)
        await proc.wait_for_log("worker_started", 60)
        return proc

    async def submit(self, seconds: float) -> str:
        """An ``h_pair`` job that runs ``seconds`` and records its runs in the ledger."""
        return await self.stack.submit("h_pair", {"seconds": seconds, "ledger": self.ledger})


@contextlib.asynccontextmanager
async def hand_fleet(
    settings: Settings, db: asyncpg.Connection, log_dir: Path, **update: Any
) -> AsyncIterator[HandFleet]:
    """``settings`` with JSON logs, a 10 s database timeout and ``update``; the hand app's types
    registered. On the way out, after the stack: every worker resumed (SIGCONT) and stopped."""
    settings = settings.model_copy(update={"db_timeout": 10.0, "log_format": "json", **update})
    await register_router_types(db, router)
    procs: list[Proc] = []
    try:
        async with running_stack(settings, None) as stack:
            yield HandFleet(settings, stack, log_dir, str(log_dir / "ledger"), procs)
    finally:
        for p in procs:
            p.signal(signal.SIGCONT)
            await p.stop(15)


def held_in_hand(log: str) -> list[tuple[uuid.UUID, dt.datetime]]:
    """Each time a worker logged a job taken into its hand (``job_held``, pen 0), in order."""
    held: list[tuple[uuid.UUID, dt.datetime]] = []
    for line in log.splitlines():
        if '"job_held"' not in line:
            continue
        rec = orjson.loads(line)
        if rec.get("pen") == 0:
            at = dt.datetime.fromisoformat(rec["ts"].replace("Z", "+00:00"))
            held.append((uuid.UUID(rec["job_id"]), at))
    return held
