"""Retry holding pens against the real broker: a retry goes to exactly one pen and waits that
pen's delay."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from conveyor import Job, JobRouter
from conveyor.core.config import Settings

from .. import db as tdb
from ..faults.checker import install_audit
from ..stack import running_stack, wait_for
from .broker_state import (
    declare_pens,
    pen_depths,
    published,
    wait_metric,
)

router = JobRouter()


@router.job("twice", max_retries=2, retry_delays=[1, 2])
async def twice(job: Job) -> None:
    raise ConnectionError(f"attempt {job.attempt} fails")


@router.job("later", max_retries=1, retry_delays=[45])
async def later(job: Job) -> None:
    raise ConnectionError("try again in 45 s")


@router.job("hour", max_retries=1, retry_delays=[60])
async def hour(job: Job) -> None:
    raise ConnectionError("try again in 60 s")


@pytest.fixture
async def audited(settings: Settings) -> AsyncIterator[Settings]:
    await install_audit(settings.database_url)
    yield settings


async def _gaps(db_url: str, job_id: str) -> list[float]:
    """Seconds from each failed attempt (→ RETRYING) to the next claim (→ IN_PROGRESS), from
    the audit trigger's ``clock_timestamp()``."""
    conn = await tdb.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT new_status, attempts, at FROM fault_audit WHERE job_id = $1 ORDER BY seq",
            uuid.UUID(job_id),
        )
    finally:
        await conn.close()
    failed = {r["attempts"]: r["at"] for r in rows if r["new_status"] == "RETRYING"}
    claimed = {r["attempts"]: r["at"] for r in rows if r["new_status"] == "IN_PROGRESS"}
    return [(claimed[n + 1] - failed[n]).total_seconds() for n in sorted(failed)]


async def test_each_retry_waits_its_own_delay(audited: Settings) -> None:
    """``retry_delays=[1, 2]``: the second retry waits ~2 s, not the first pen's 1 s (a pen
    routing every retry would bring a copy back after 1 s)."""
    async with running_stack(audited, router) as stack:
        job_id = await stack.submit("twice")
        assert (await wait_for(audited.database_url, [job_id]))[uuid.UUID(job_id)] == "FAILED"
    first, second = await _gaps(audited.database_url, job_id)
    assert 0.9 <= first < 2.5, first
    assert 1.9 <= second < 3.5, second


@pytest.mark.parametrize(("job_type", "delay"), [("later", 45), ("hour", 60)])
async def test_one_retry_leaves_one_message_in_one_pen(
    settings: Settings, job_type: str, delay: int
) -> None:
    """Pens of other delays already exist (earlier retries): the retry is in its own pen only,
    e.g. a 60 s wait leaves no copy in the 30 s pen."""
    others = [1, 2, 3, 5, 30, 45, 60, 90]
    await declare_pens(settings, others)
    async with running_stack(settings, router) as stack:
        await stack.submit(job_type)
        await wait_metric(lambda: published(stack.relay, "retry") >= 1, what="the retry published")
        depths = await pen_depths(settings, others)
    assert depths == {d: (1 if d == delay else 0) for d in others}
