"""Soak: two real ``conveyor sweeper`` processes share one ``every_seconds=1`` schedule for
``SCHEDULE_SOAK_SECONDS`` (default 330 s); every 45 s one of them is SIGKILLed and restarted.
Each tick must have exactly one job: no duplicate, no tick missing between the first and the
last. ``pytest -m soak tests/faults/test_schedule_soak.py -s`` prints the figures."""

from __future__ import annotations

import asyncio
import os
import random
import time
from datetime import timedelta
from pathlib import Path

import pytest

from conveyor.core.config import Settings
from conveyor.jobs.schedules import build_schedule
from conveyor.store import for_schema

from .. import db as tdb
from .harness import Proc, component_env, conveyor_command


@pytest.mark.soak
@pytest.mark.timeout(1800)
async def test_two_sweepers_one_job_per_tick(settings: Settings, tmp_path: Path) -> None:
    seconds = float(os.environ.get("SCHEDULE_SOAK_SECONDS", "330"))
    conn = await tdb.connect(settings.database_url)
    try:
        await for_schema(tdb.SCHEMA).schedule_upsert(
            conn, build_schedule("soak", "t", every_seconds=1, payload={"soak": True})
        )
        env = component_env(settings)
        cmd = [*conveyor_command(), "sweeper"]
        procs = [Proc(f"sweeper{i}", cmd, env, tmp_path).start() for i in range(2)]
        rng = random.Random(20261122)
        kills = 0
        started = time.monotonic()
        try:
            while time.monotonic() - started < seconds:
                await asyncio.sleep(45)
                i = rng.randrange(2)
                await procs[i].kill()
                kills += 1
                procs[i] = Proc(f"sweeper{i}", cmd, env, tmp_path).start()
        finally:
            codes = await asyncio.gather(*(p.stop() for p in procs))
        rows = await conn.fetch(
            "SELECT (meta->>'tick')::timestamptz AS tick, count(*) AS n FROM jobs "
            "WHERE meta->>'schedule' = 'soak' GROUP BY 1 ORDER BY 1"
        )
    finally:
        await conn.close()
    ticks = [r["tick"] for r in rows]
    jobs = sum(r["n"] for r in rows)
    duplicates = sum(r["n"] - 1 for r in rows)
    span = int((ticks[-1] - ticks[0]) / timedelta(seconds=1)) + 1
    print(f"[schedules soak] {seconds:.0f} s, 2 sweepers, {kills} SIGKILLs: ticks {span}, "
          f"ticks with a job {len(ticks)}, jobs {jobs}, duplicates {duplicates}, "
          f"exit codes {codes}")  # fmt: skip
    assert duplicates == 0
    assert len(ticks) == span == jobs, "a tick between the first and the last has no job"
    assert span >= seconds - 15
