"""A long soak (``pytest -m soak tests/faults``): for ``FAULTS_SOAK_SECONDS`` (default 180) jobs
stream in while workers are SIGKILLed, the relay fails between confirm and delete, and the
private RabbitMQ node drops every connection or restarts. Then the checker."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from conveyor.core.config import Settings

from .checker import Ledger, check
from .harness import WorkerFleet, fault_settings, running
from .infra import PrivateRabbit
from .relay_faults import after_confirm

SOAK_SECONDS = float(os.environ.get("FAULTS_SOAK_SECONDS", "180"))


@pytest.mark.soak
@pytest.mark.timeout(int(SOAK_SECONDS) + 600)
async def test_soak_mixed_faults(
    fsettings: Settings, rabbit: PrivateRabbit, ledger: Ledger, tmp_path: Path
) -> None:
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    rng = random.Random(seed)
    settings = fault_settings(fsettings, amqp_url=rabbit.amqp_url, reconcile_after=10.0)
    relay_failures = 0

    async def fail(results: object) -> None:
        nonlocal relay_failures
        if rng.random() < 0.1:
            relay_failures += 1
            raise RuntimeError("soak: relay fails between confirm and delete")

    faults: dict[str, int] = {"sigkill": 0, "close_connections": 0, "broker_restart": 0}
    async with running(settings, relay_setup=lambda r: after_confirm(r, fail)) as stack:
        fleet = WorkerFleet(settings, tmp_path, 3, concurrency=6)
        await fleet.ready()
        stop = asyncio.Event()
        supervisor = asyncio.create_task(fleet.supervise(stop))

        async def submit() -> None:
            while not stop.is_set():
                await stack.submit_many(
                    10,
                    "work",
                    lambda i: {"ledger": str(ledger), "sleep": round(rng.uniform(0.02, 0.4), 3)},
                    parallel=10,
                )
                await asyncio.sleep(0.2)

        async def chaos() -> None:
            while not stop.is_set():
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                roll = rng.random()
                if roll < 0.8:
                    await fleet.kill_one(rng)
                    faults["sigkill"] += 1
                elif roll < 0.95:
                    await asyncio.to_thread(rabbit.close_all_connections, "soak")
                    faults["close_connections"] += 1
                else:
                    await asyncio.to_thread(rabbit.restart, rng.uniform(0.5, 3.0))
                    faults["broker_restart"] += 1

        tasks = [asyncio.create_task(submit()), asyncio.create_task(chaos())]
        await asyncio.sleep(SOAK_SECONDS)
        stop.set()
        await asyncio.gather(*tasks)
        await supervisor
        v = await check(settings.database_url, stack.accepted, ledger, label="soak", timeout=180)
        v.extra.update(seed=seed, relay_failures=relay_failures, **faults)
        await fleet.stop()
    v.assert_clean()
