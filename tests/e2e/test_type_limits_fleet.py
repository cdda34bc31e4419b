"""Fleet-wide limits with three worker *processes* (``conveyor worker``) claiming the same
types: sampled IN_PROGRESS never exceeds ``concurrency``; starts in any sliding window never
exceed ``rate_limit``; a limit changed through the API applies to every worker; a type without
limits is not held back. ``LIMITS_SCALE`` (soak) multiplies the jobs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types

from .. import db as tdb
from ..integration import feature_apps as apps
from ..stack import running_stack, wait_for

ROOT = Path(__file__).resolve().parents[2]
SOAK_SCALE = int(os.environ.get("LIMITS_SCALE", "5"))


async def _workers(settings: Settings, n: int) -> list[asyncio.subprocess.Process]:
    env = {**os.environ, "CONVEYOR_DATABASE_URL": settings.database_url,
           "CONVEYOR_AMQP_URL": settings.amqp_url, "CONVEYOR_NAMESPACE": settings.namespace,
           "CONVEYOR_TYPE_REFRESH_INTERVAL": "0.2", "CONVEYOR_LOG_LEVEL": "WARNING"}  # fmt: skip
    return [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "conveyor.cli",
            "worker",
            "--app",
            "tests.integration.feature_apps:limited",
            "--concurrency",
            "4",
            env=env,
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


class Sampler:
    """IN_PROGRESS per type, sampled every 10 ms; the peak of each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.peak: dict[str, int] = {}
        self.samples = 0

    async def run(self) -> None:
        conn = await tdb.connect(self.url)
        try:
            while True:
                rows = await conn.fetch("SELECT job_type, count(*) AS n FROM jobs "
                                        "WHERE status = 'IN_PROGRESS' GROUP BY 1")  # fmt: skip
                for r in rows:
                    self.peak[r["job_type"]] = max(self.peak.get(r["job_type"], 0), r["n"])
                self.samples += 1
                await asyncio.sleep(0.01)
        finally:
            await conn.close()


def _max_in_window(starts: list[float], period: float) -> int:
    starts = sorted(starts)
    best, j = 0, 0
    for i, s in enumerate(starts):
        while starts[j] <= s - period:
            j += 1
        best = max(best, i - j + 1)
    return best


@pytest.mark.timeout(180)
async def test_three_workers_keep_concurrency_and_rate_limits(
    settings: Settings, db: asyncpg.Connection
) -> None:
    await _fleet(settings, db, 1)


@pytest.mark.soak
@pytest.mark.timeout(900)
async def test_three_workers_keep_the_limits_over_a_longer_run(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """``LIMITS_SCALE`` (5) times the jobs of the quick test."""
    await _fleet(settings, db, SOAK_SCALE)


async def _fleet(settings: Settings, db: asyncpg.Connection, scale: int) -> None:
    # The API fails fast (503 after CONVEYOR_DB_TIMEOUT, 1.5 s) by design; this test measures the
    # limits, and submits while three worker processes start beside the other tests on two
    # cores, which can starve a submit past 1.5 s.
    settings = settings.model_copy(update={"db_timeout": 10.0})
    await register_router_types(db, apps.limited)
    procs = await _workers(settings, 3)
    sampler = Sampler(settings.database_url)
    sampling = asyncio.create_task(sampler.run())
    try:
        async with running_stack(settings, None) as stack:
            t0 = time.monotonic()
            limited = [await stack.submit("f_limited", {"seconds": 0.3})
                       for _ in range(15 * scale)]  # fmt: skip
            rated = [await stack.submit("f_rated") for _ in range(25 * scale)]
            free = [await stack.submit("f_free", {"seconds": 1.0}) for _ in range(8)]
            await wait_for(settings.database_url, limited + rated + free, ["COMPLETED"],
                           timeout=60 * scale)  # fmt: skip
            took = time.monotonic() - t0
            peak_limited, peak_free = sampler.peak["f_limited"], sampler.peak["f_free"]
            starts = [r["t"] for r in await db.fetch(
                "SELECT extract(epoch FROM started_at)::float8 AS t FROM jobs "
                "WHERE job_type = 'f_rated'")]  # fmt: skip
            attempts = await db.fetchval("SELECT max(attempts) FROM jobs WHERE job_type IN "
                                         "('f_limited', 'f_rated')")  # fmt: skip
            workers_used = await db.fetchval("SELECT count(DISTINCT worker_id) FROM jobs "
                                             "WHERE job_type = 'f_limited'")  # fmt: skip

            # changed at run time: every worker applies it within a refresh
            r = await stack.client.put("/types/f_limited/limits", json={"concurrency": 1})
            assert r.status_code == 200, r.text
            assert r.json()["concurrency"] == 1 and r.json()["limits_source"] == "operator"
            await asyncio.sleep(0.6)
            sampler.peak.pop("f_limited")
            more = [await stack.submit("f_limited", {"seconds": 0.2}) for _ in range(4)]
            await wait_for(settings.database_url, more, ["COMPLETED"], timeout=60)
            peak_after = sampler.peak["f_limited"]
            listed = {t["name"]: t for t in (await stack.client.get("/types")).json()["types"]}
    finally:
        sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            await asyncio.wait_for(p.wait(), 30)
    window = _max_in_window(starts, 2.0)
    print(
        f"\nlimits: {sampler.samples} samples; f_limited peak {peak_limited} (limit 3), "
        f"after the change {peak_after} (limit 1); f_rated max {window} starts in any 2 s "
        f"(limit 10), {len(starts)} jobs over {max(starts) - min(starts):.1f} s; f_free peak "
        f"{peak_free}; {workers_used} workers ran f_limited; all done in {took:.1f} s"
    )
    assert peak_limited == 3 and peak_after == 1
    assert window <= 10
    assert max(starts) - min(starts) >= 2.0 * (len(starts) / 10 - 1)  # really spread out
    assert attempts == 1  # held jobs consumed no attempt
    assert workers_used >= 2
    assert peak_free > 3  # a type without limits is not held back
    assert listed["f_rated"]["rate_limit"] == "10/2s" and listed["f_limited"]["concurrency"] == 1
