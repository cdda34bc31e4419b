"""A sweeper frozen (SIGSTOP) inside the schedules transaction, its connection open and the
schedule row locked, while another sweeper runs: the other takes the schedule over within
seconds and every tick of the frozen period is enqueued exactly once — none skipped as missed
(the fleet was not down: a peer held the lock), none doubled, also after the frozen one resumes.
Two real sweeper processes, a one-second schedule, ``schedule_grace`` shorter than the freeze."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from conveyor.core.config import Settings
from conveyor.jobs.schedules import build_schedule
from conveyor.store import for_schema

from .. import db as tdb
from .harness import Proc, component_env, conveyor_command

FREEZE = 20.0
GRACE = 5.0  # shorter than the freeze: a tick delayed by a paused peer is not a missed tick
MAX_LATE = 10.0  # seconds from a tick to its job, the takeover included


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def _until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_paused_sweeper_delays_no_tick_and_doubles_none(
    settings: Settings, tmp_path: Path
) -> None:
    conn = await tdb.connect(settings.database_url)
    flag = tmp_path / "pause"
    env = component_env(settings.model_copy(update={"schedule_grace": GRACE}))
    # the one to freeze passes more often, so it is the one that takes the due schedule
    quick = {**env, "CONVEYOR_SCHEDULES_INTERVAL": "0.1"}
    paused = Proc("paused", [sys.executable, "-m", "tests.faults.pausing_sweeper", str(flag)],
                  quick, tmp_path)  # fmt: skip
    other = Proc("other", [*conveyor_command(), "sweeper"], env, tmp_path)
    try:
        await for_schema(tdb.SCHEMA).schedule_upsert(
            conn, build_schedule("gray", "t", every_seconds=1)
        )
        paused.start()
        other.start()

        async def ticking() -> bool:
            return bool(await conn.fetchval("SELECT count(*) >= 3 FROM jobs"))

        await _until(ticking, 30, "the sweepers never enqueued a tick")
        flag.touch()

        async def frozen() -> bool:
            return _state(paused.pid) == "T"

        await _until(frozen, 10, "the sweeper never reached the schedules transaction")
        frozen_at: datetime = await conn.fetchval("SELECT clock_timestamp()")
        held = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'conveyor-sweeper' AND state = 'idle in transaction'"
        )
        assert held == 1, "the frozen sweeper should hold its schedules transaction open"
        await asyncio.sleep(FREEZE)
        resumed_at: datetime = await conn.fetchval("SELECT clock_timestamp()")
        paused.signal(signal.SIGCONT)
        await asyncio.sleep(GRACE + 2)  # the resumed sweeper passes again; nothing doubles
        end: datetime = await conn.fetchval("SELECT clock_timestamp()")
        rows = await conn.fetch(
            "SELECT (meta->>'tick')::timestamptz AS tick, count(*) AS n, "
            "max(created_at) AS created FROM jobs WHERE meta->>'schedule' = 'gray' "
            "GROUP BY 1 ORDER BY 1"
        )
    finally:
        await asyncio.gather(paused.stop(), other.stop())
        await conn.close()
    by_tick = {r["tick"]: r for r in rows}
    first = min(by_tick)
    want = [first + timedelta(seconds=k) for k in range(int((end - first).total_seconds()) - 1)]
    missing = [t for t in want if t not in by_tick]
    doubled = {t: r["n"] for t, r in by_tick.items() if r["n"] != 1}
    window = [t for t in want if frozen_at <= t <= resumed_at and t in by_tick]
    late = max((by_tick[t]["created"] - t).total_seconds() for t in window) if window else None
    print(f"[paused sweeper] froze {FREEZE:.0f} s: ticks {len(want)}, missing {len(missing)}, "
          f"doubled {len(doubled)}, ticks of the frozen period enqueued {len(window)}, "
          f"latest {late} s after their tick")  # fmt: skip
    assert not doubled
    assert not missing, f"{len(missing)} ticks never enqueued: {missing[:5]}…"
    assert late is not None and late <= MAX_LATE, f"a tick waited {late} s for its job"
