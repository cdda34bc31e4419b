"""Weighted job types on one worker: under a backlog of both, a worker takes them in proportion
to their weights (per-type shares of ``--concurrency`` as per-consumer prefetch)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from conveyor.core.config import Settings
from conveyor.core.limits import parse_weights, shares
from conveyor.jobs.types import register_router_types

from ..stack import running_stack, wait_for
from . import feature_apps as apps


def test_shares_follow_the_weights() -> None:
    assert shares(4, {"a": 3}, ["a", "b"]) == {"a": 3, "b": 1}
    assert shares(16, {"a": 3, "b": 1}, ["a", "b"]) == {"a": 12, "b": 4}
    assert shares(10, {"a": 1, "b": 1, "c": 1}, ["a", "b", "c"]) == {"a": 4, "b": 3, "c": 3}
    assert shares(3, {"a": 100}, ["a", "b"]) == {"a": 2, "b": 1}  # everyone keeps a slot
    assert shares(8, {}, ["a", "b"]) == {}  # no weights: the slots are shared freely
    with pytest.raises(ValueError):
        shares(8, {"z": 2}, ["a"], given={"z": 2})
    assert parse_weights("emails=3, reports=1") == {"emails": 3, "reports": 1}
    for bad in ("emails", "emails=0", "=3", "a=x"):
        with pytest.raises(ValueError):
            parse_weights(bad)


async def test_a_worker_takes_weighted_types_in_proportion(
    settings: Settings, db: asyncpg.Connection
) -> None:
    await register_router_types(db, apps.weighted)
    async with running_stack(settings, None) as stack:
        ids = []
        for _ in range(40):  # interleaved: the same backlog of both
            ids.append(await stack.submit("f_heavy"))
            ids.append(await stack.submit("f_light"))
        for _ in range(100):  # published: both queues hold their backlog
            if await db.fetchval("SELECT count(*) FROM job_outbox") == 0:
                break
            await asyncio.sleep(0.05)
        worker = await stack.add_worker(apps.weighted, concurrency=4)
        assert worker.shares == {"f_heavy": 3, "f_light": 1}
        await wait_for(settings.database_url, ids[::2], ["COMPLETED"], timeout=30)  # f_heavy
    rows = await db.fetch("SELECT job_type, started_at FROM jobs WHERE started_at IS NOT NULL "
                          "ORDER BY started_at")  # fmt: skip
    heavy_done = max(r["started_at"] for r in rows if r["job_type"] == "f_heavy")
    both = [r["job_type"] for r in rows if r["started_at"] <= heavy_done]  # both backlogged
    heavy, light = both.count("f_heavy"), both.count("f_light")
    print(
        f"\nweights 3:1 on 4 slots, while both were backlogged: {heavy} f_heavy, "
        f"{light} f_light started ({heavy / max(light, 1):.2f}:1)"
    )
    assert heavy == 40 and 2.4 <= heavy / light <= 3.6
