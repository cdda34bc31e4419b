"""The gray nemesis (``gray.py``): pauses (SIGSTOP 2-30 s, aimed inside transactions),
partitions (a component's PostgreSQL and/or RabbitMQ connections blackholed 10-60 s), lost hosts
(frozen inside a transaction for good, replaced) and the crash faults. Then, after a bounded
settle with the lost hosts still frozen: lost = stuck = double-COMPLETED = 0, no job over its
attempt budget, every accepted job COMPLETED, and the schedule: at most one job per tick and
still ticking after the faults stopped.

``make test`` runs a smoke on the shared services (pauses and partitions that heal, SIGKILLs);
``-m soak`` runs it against a private RabbitMQ node and PostgreSQL cluster for ``GRAY_SECONDS``
(default 600), seeded by ``FAULTS_SEED``, settling for at most ``GRAY_SETTLE_SECONDS`` (default
300: well above the lease, the reconciler's delay and the sessions' idle bounds, on a loaded
two-core machine). As root with ``ip``, the soak also runs a worker, a publisher and a sweeper
on a second host (``LINK_HOST``) whose link goes down 10-60 s at a time (``gray.py``: ``link``):
the sessions the server's keepalives end during those cuts are counted (``link_sessions``;
``keepalive_idle`` / ``keepalive_in_txn``), and a run whose cuts were long enough for them
must show one. ``GRAY_LINK_KEEPALIVES=off`` runs that host without keepalives and
``tcp_user_timeout`` (the kernel's two hours), to compare. The smoke has no second host: the
shared PostgreSQL listens on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from conveyor.core.config import Settings
from conveyor.store import for_schema

from .. import db as tdb
from . import netns
from .checker import Ledger, check
from .gray import SCHEDULE, GrayNemesis
from .harness import fault_settings
from .infra import PrivatePostgres, PrivateRabbit

LINK_HOST = ("worker-2", "publisher-2", "sweeper-2")
# a cut this long outlasts the keepalives (5 s idle + 3 probes 2 s apart; tcp_user_timeout 10 s)
KEEPALIVE_CUT = 20.0


async def _schedule_alive(db_url: str, since: float, timeout: float) -> float | None:
    """Seconds after ``since`` (``time.time``) until a tick's job is created after it, or None."""
    conn = await tdb.connect(db_url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = await conn.fetchval(
                "SELECT min(created_at) FROM jobs WHERE meta->>'schedule' = $1"
                " AND created_at > to_timestamp($2)", SCHEDULE, since,
            )  # fmt: skip
            if seen is not None:
                return float(seen.timestamp() - since)
            await asyncio.sleep(0.5)
    finally:
        await conn.close()
    return None


async def _pause_schedule(db_url: str) -> bool:
    """Pause the schedule so the settle can end (False: its row stayed locked 20 s)."""
    conn = await tdb.connect(db_url)
    try:
        await asyncio.wait_for(
            for_schema(tdb.SCHEMA).schedule_set_enabled(conn, SCHEDULE, False, None), 20
        )
        return True
    except TimeoutError:
        return False
    finally:
        await conn.close()


def _slow(r: Any) -> str:
    return f"{r['n']} (worst {float(r['worst']):.0f}s, submitted {r['first']}-{r['last']})"


async def _figures(db_url: str, accepted: list[str]) -> dict[str, Any]:
    conn = await tdb.connect(db_url)
    try:
        worst = await conn.fetchrow(
            "SELECT max(extract(epoch FROM finished_at - created_at)) AS worst,"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at -"
            " created_at)) AS p99 FROM jobs WHERE id = ANY($1::uuid[])", accepted,
        )  # fmt: skip
        # jobs that took over a minute from submit to finish, by type: how many, when submitted
        slow = await conn.fetch(
            "SELECT job_type, count(*) AS n, max(extract(epoch FROM finished_at - created_at))"
            " AS worst, to_char(min(created_at), 'HH24:MI:SS') AS first,"
            " to_char(max(created_at), 'HH24:MI:SS') AS last FROM jobs"
            " WHERE finished_at - created_at > interval '60 seconds' GROUP BY 1"
        )
        outbox = await conn.fetchrow(
            "SELECT count(*) AS n, extract(epoch FROM now() - min(o.created_at)) AS age,"
            " string_agg(DISTINCT j.status::text, ',') AS statuses"
            " FROM job_outbox o LEFT JOIN jobs j ON j.id = o.job_id"
        )
        ticks = await conn.fetch(
            "SELECT (meta->>'tick')::timestamptz AS tick, count(*) AS n FROM jobs"
            " WHERE meta->>'schedule' = $1 GROUP BY 1 ORDER BY 1", SCHEDULE,
        )  # fmt: skip
    finally:
        await conn.close()
    gaps = [(b["tick"] - a["tick"]).total_seconds() for a, b in itertools.pairwise(ticks)]
    return {
        "worst_s": round(float(worst["worst"] or 0), 1),
        "p99_s": round(float(worst["p99"] or 0), 1),
        "over_60s": {r["job_type"]: _slow(r) for r in slow},
        # outbox rows nobody relays (a lost publisher's batch): their age and their jobs' status
        "outbox_stranded": int(outbox["n"]),
        "outbox_oldest_s": round(float(outbox["age"] or 0), 1),
        "outbox_job_statuses": outbox["statuses"],
        "ticks": len(ticks),
        "tick_duplicates": sum(r["n"] - 1 for r in ticks),
        "longest_tick_gap_s": max(gaps, default=0.0),
        "last_tick": ticks[-1]["tick"] if ticks else None,
    }


async def _run(nemesis: GrayNemesis, seconds: float, label: str, settle: float) -> None:
    async with nemesis.gray_running(seconds) as stopped:
        url = nemesis.settings.database_url
        revived = await _schedule_alive(url, stopped, settle)
        paused = await _pause_schedule(url)
        v = await check(url, nemesis.accepted, nemesis.ledger, label=label, timeout=settle)
        over = await nemesis.over_budget()
        statuses = await nemesis.statuses(nemesis.accepted)
        figures = await _figures(url, nemesis.accepted)
    v.extra.update(
        seconds=seconds, over_budget=len(over), refused=nemesis.refused,
        restarts=nemesis.restarts, schedule_ticked_after_s=revived, schedule_paused=paused,
        **figures, landed_in_txn=dict(nemesis.landed), **dict(sorted(nemesis.faults.items())),
    )  # fmt: skip
    if nemesis.link is not None:
        v.extra.update(link_cuts_s=sorted(nemesis.link_cuts),
                       link_sessions=dict(sorted(nemesis.link_sessions.items())),
                       rabbit_missed_heartbeats=_missed_heartbeats(nemesis))  # fmt: skip
    print("\n" + v.summary())
    for note in nemesis.notes:
        print(f"[gray] {note}")
    for problem in v.problems[:20]:
        print(f"[gray] {problem}")
    v.assert_clean(expect=None)
    assert not over, f"{len(over)} jobs over their attempt budget: {over[:5]}"
    assert statuses == {"COMPLETED": len(nemesis.accepted)}, statuses
    assert figures["outbox_stranded"] == 0, figures
    assert figures["tick_duplicates"] == 0, figures
    assert revived is not None, f"no schedule tick in {settle}s after the faults stopped"
    if nemesis.link is not None and not nemesis.link_overrides:
        ended = sum(n for k, n in nemesis.link_sessions.items() if k.startswith("keepalive"))
        long_cuts = [s for s in nemesis.link_cuts if s >= KEEPALIVE_CUT]
        assert ended or not long_cuts, (
            f"{len(long_cuts)} cuts of {KEEPALIVE_CUT}+ s and no session ended by the"
            f" keepalives: {dict(nemesis.link_sessions)}"
        )


def _missed_heartbeats(nemesis: GrayNemesis) -> int:
    """Connections RabbitMQ closed for missed client heartbeats (the link's host's, in a cut)."""
    if nemesis.rabbit is None:
        return 0
    logs = (nemesis.rabbit.base / "log").glob("*.log")
    return sum(p.read_text(errors="replace").count("missed heartbeats from client") for p in logs)


def _seed() -> int:
    return int(os.environ.get("FAULTS_SEED", time.time()))


@pytest.mark.timeout(240)
async def test_gray_nemesis_smoke(fsettings: Settings, ledger: Ledger, tmp_path: Path) -> None:
    """``GRAY_SMOKE_SECONDS`` (default 20) on the shared services: pauses of 2-8 s and
    partitions of 5-15 s that heal, SIGKILLs; no lost host, no broker or database restart."""
    seed = _seed()
    nemesis = GrayNemesis(
        fsettings, tmp_path, ledger, random.Random(seed), adversaries=(), lost_hosts=False,
        pause_s=(2.0, 8.0), partition_s=(5.0, 15.0), chaos_every=(1.0, 3.0),
    )  # fmt: skip
    seconds = float(os.environ.get("GRAY_SMOKE_SECONDS", "20"))
    await _run(nemesis, seconds, f"gray-smoke seed={seed}", settle=120)


GRAY_SECONDS = float(os.environ.get("GRAY_SECONDS", "600"))
GRAY_SETTLE = float(os.environ.get("GRAY_SETTLE_SECONDS", "300"))


@pytest.mark.soak
@pytest.mark.timeout(int(GRAY_SECONDS + 3 * GRAY_SETTLE) + 300)
async def test_gray_nemesis_soak(
    fsettings: Settings,
    rabbit: PrivateRabbit,
    private_pg: PrivatePostgres,
    private_db_url: str,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    seed = _seed()
    settings = fault_settings(
        fsettings, amqp_url=rabbit.amqp_url, database_url=private_db_url, reconcile_after=10.0
    )
    off = os.environ.get("GRAY_LINK_KEEPALIVES", "on") == "off"
    link_overrides: dict[str, Any] = {
        "db_keepalives_idle": 0, "db_keepalives_interval": 0, "db_keepalives_count": 0,
        "db_tcp_user_timeout": 0.0,
    } if off else {}  # fmt: skip
    nemesis = GrayNemesis(
        settings, tmp_path, ledger, random.Random(seed), adversaries=(), rabbit=rabbit,
        pg=private_pg, chaos_every=(2.0, 5.0),
        link_host=LINK_HOST if netns.available() else (), link_overrides=link_overrides,
    )  # fmt: skip
    started = datetime.now(UTC).strftime("%H:%M:%S")
    await _run(nemesis, GRAY_SECONDS, f"gray seed={seed} from={started}", GRAY_SETTLE)
