"""A real partition (``netns.Link``: a host whose link goes down, nothing answers, nothing
resets) against each part of the session bounds, one at a time. Four pools with the
components' bounds (``link_holder``) on the vanishing host, each holding a lock inside a
transaction and an idle session outside one:

- ``bounds`` (the defaults): the lock goes with ``idle_in_transaction_session_timeout`` (5 s),
  the idle session with the keepalives (5 s idle, 3 probes 2 s apart; ``tcp_user_timeout``
  10 s);
- ``no_keepalives`` (keepalives and ``tcp_user_timeout`` 0: the kernel's two hours): the lock
  still goes with the idle bound, the idle session outlives the partition;
- ``no_idle_bound``: the keepalives end the locking session too, in about 11 s;
- ``neither``: the lock is held as long as the partition lasts (``LINK_PARTITION_SECONDS``,
  default 25; a host that never comes back holds it for the kernel's two hours).

Each ending is read from the server's log (``netns.session_endings``), so a test passes only
when the bound it names is the one that ended the session."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from conveyor.core.config import Settings

from . import netns
from .harness import Proc, component_env
from .infra import PrivatePostgres

PARTITION = float(os.environ.get("LINK_PARTITION_SECONDS", "25"))
OFF_KEEPALIVES = {"db_keepalives_idle": 0, "db_keepalives_interval": 0,
                  "db_keepalives_count": 0, "db_tcp_user_timeout": 0.0}  # fmt: skip
VARIANTS: dict[str, dict[str, float]] = {
    "bounds": {},
    "no_keepalives": OFF_KEEPALIVES,
    "no_idle_bound": {"db_idle_in_transaction_timeout": 0.0},
    "neither": {**OFF_KEEPALIVES, "db_idle_in_transaction_timeout": 0.0},
}


@pytest.mark.timeout(int(PARTITION) + 120)
@pytest.mark.skipif(not netns.available(), reason="needs root and ip")
async def test_each_bound_against_a_real_partition(tmp_path: Path) -> None:
    settings = Settings()
    pg = PrivatePostgres()
    link = netns.Link()
    holders: dict[str, Proc] = {}
    try:
        pg.start()
        link.create()
        pg.reach_from(link.host_ip, link.ns_ip)
        url = f"postgresql://postgres@{link.host_ip}:{pg.port}/postgres"
        for key, (name, overrides) in enumerate(VARIANTS.items(), start=1):
            s = settings.model_copy(update={"database_url": url, **overrides})
            args = [*link.exec_prefix(), sys.executable, "-m", "tests.faults.link_holder",
                    str(key)]  # fmt: skip
            holders[name] = Proc(name, args, component_env(s), tmp_path).start()
        pids: dict[str, tuple[int, int]] = {}
        for name, proc in holders.items():
            await proc.wait_for_log("holding", 60)
            words = proc.log().split("holding ", 1)[1].split()
            pids[name] = (int(words[0]), int(words[1]))

        conn = await asyncpg.connect(pg.url(), timeout=10)
        try:

            async def alive() -> set[int]:
                rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE client_addr"
                                        " = $1::inet", link.ns_ip)  # fmt: skip
                return {int(r["pid"]) for r in rows}

            everyone = {p for pair in pids.values() for p in pair}
            assert everyone <= await alive()
            offset = netns.log_size(pg.log)
            link.down()
            started = time.monotonic()
            ended: dict[int, float] = {}
            while time.monotonic() - started < PARTITION:
                now = await alive()
                for pid in everyone - now - set(ended):
                    ended[pid] = round(time.monotonic() - started, 1)
                await asyncio.sleep(0.2)
            link.up()
        finally:
            await conn.close()
        why = netns.session_endings(pg.log, offset)

        def fate(pid: int) -> str:
            if pid not in ended:
                return f"alive after {PARTITION:.0f} s"
            return f"{why.get(pid, 'unexplained')} {ended[pid]} s"

        figures = {name: (fate(lock), fate(idle)) for name, (lock, idle) in pids.items()}
        for name, (lock, idle) in figures.items():
            print(f"[faults] link down {PARTITION:.0f} s, {name}: locking session {lock},"
                  f" idle session {idle}")  # fmt: skip

        def ended_by(pid: int, cause: str, within: float) -> bool:
            return why.get(pid) == cause and ended.get(pid, PARTITION) < within

        lock, idle = pids["bounds"]
        assert ended_by(lock, "idle_bound", 9) and ended_by(idle, "keepalive", 20), figures
        lock, idle = pids["no_keepalives"]
        assert ended_by(lock, "idle_bound", 9) and idle not in ended, figures
        lock, idle = pids["no_idle_bound"]
        assert ended_by(lock, "keepalive", 20) and ended_by(idle, "keepalive", 20), figures
        lock, idle = pids["neither"]
        assert lock not in ended and idle not in ended, figures  # stranded
    finally:
        for proc in holders.values():
            await proc.kill()
        link.close()
        with contextlib.suppress(Exception):
            pg.stop()
