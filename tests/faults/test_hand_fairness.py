"""Jobs held in one worker's hand are not starved by another worker that holds the type's slots.

A type limited to two: worker B starts alone on a backlog (it runs two, holds more in hand),
then worker A starts and holds jobs of the backlog in its hand too. Each slot B frees wakes B's
own hand at once, while A's hand retries on a backoff (0.05-1 s): unless a claim prefers the
jobs held longest in any hand, B keeps both slots for as long as it has jobs (its hand refills
from the queue) and A's jobs wait out the backlog. The test reads when each worker took each job
into its hand (its log's ``job_held``, pen 0) and when the job started (``started_at``): the
longest time a job waited in either hand measures the starvation (which worker is starved
depends on which took the slots first)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from pathlib import Path

import asyncpg
import pytest

from conveyor.core.config import Settings

from .hand_fleet import hand_fleet, held_in_hand

JOBS = 150
# per job: the backlog takes JOBS * SECONDS / 2 = 15 s at the limit of two; a slot is free
# for a few milliseconds after each job, so a starved hand's retry (every second) rarely wins
SECONDS = 0.2


def _first_held(log: str) -> dict[uuid.UUID, dt.datetime]:
    """When the worker first took each job into its hand (``job_held``, pen 0)."""
    held: dict[uuid.UUID, dt.datetime] = {}
    for job, at in held_in_hand(log):
        held.setdefault(job, at)
    return held


@pytest.mark.timeout(240)
async def test_a_workers_hand_is_not_starved_by_a_worker_holding_the_slots(
    settings: Settings, db: asyncpg.Connection, tmp_path: Path
) -> None:
    async with hand_fleet(
        settings, db, tmp_path, visibility_timeout=30.0, log_level="DEBUG"
    ) as fleet:
        b = await fleet.worker("b")
        ids = await asyncio.gather(*(fleet.submit(SECONDS) for _ in range(JOBS)))
        a = await fleet.worker("a")
        deadline = time.monotonic() + 120
        wanted = [uuid.UUID(i) for i in ids]
        while time.monotonic() < deadline:
            n = await db.fetchval(
                "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[]) AND status = 'COMPLETED'",
                wanted,
            )
            if n == JOBS:
                break
            await asyncio.sleep(0.2)
        assert await a.stop(30) == 0, a.log()[-3000:]
        assert await b.stop(30) == 0, b.log()[-3000:]
        rows = await db.fetch(
            "SELECT id, status::text AS s, started_at, worker_id, attempts FROM jobs "
            "WHERE id = ANY($1::uuid[])",
            wanted,
        )
    by_id = {r["id"]: r for r in rows}
    assert all(r["s"] == "COMPLETED" and r["attempts"] == 1 for r in rows)

    def waits(held: dict[uuid.UUID, dt.datetime]) -> list[float]:
        return sorted(
            (by_id[i]["started_at"] - at).total_seconds()
            for i, at in held.items()
            if i in by_id and by_id[i]["started_at"] >= at
        )

    a_waits, b_waits = waits(_first_held(a.log())), waits(_first_held(b.log()))
    ran_a = sum(1 for r in rows if f":{a.pid}:" in (r["worker_id"] or ""))
    print(
        f"\nhand fairness: {JOBS} jobs of {SECONDS} s at a limit of 2; A ran {ran_a}, "
        f"held {len(a_waits)} (longest in hand {a_waits[-1] if a_waits else 0:.1f} s), "
        f"B held {len(b_waits)} (longest {b_waits[-1] if b_waits else 0:.1f} s)"
    )
    assert a_waits, "A held no job in its hand"
    # a job held for 2 s is first in line for the next slot freed on either worker; without
    # that rule the worker that got the slots first kept them until the other's retry won a
    # race for a slot freed for a few milliseconds
    worst = max(a_waits[-1], b_waits[-1] if b_waits else 0.0)
    assert worst < 6.0, (a_waits[-5:], b_waits[-5:])
