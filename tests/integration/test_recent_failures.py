"""The ``recent_failures`` view (docs/operations.md) groups the last hour's failed attempts by
type, error class and the error's first line (``Type: message``), so one cause raised from
two places is one row, and a ``Retry`` snooze (no retry used up) is not a failure."""

from __future__ import annotations

from typing import Any

import asyncpg

from conveyor import Job, JobRouter, Retry, enqueue
from conveyor.testing import drain, register_types

router = JobRouter()


def _fetch_a() -> None:
    raise ConnectionError("upstream down")


def _fetch_b() -> None:
    raise ConnectionError("upstream down")


@router.job("rf_flaky", max_retries=1)
async def rf_flaky(job: Job) -> None:
    (_fetch_a if job.attempt == 1 else _fetch_b)()  # the same cause, two tracebacks


@router.job("rf_snoozer")
async def rf_snoozer(job: Job) -> str:
    if job.attempt == 1:
        raise Retry(delay=60, reason="not yet")
    return "done"


async def test_grouped_by_class_and_first_line_without_snoozes(db: asyncpg.Connection) -> None:
    await register_types(db, router)
    await enqueue(db, "rf_flaky")
    await enqueue(db, "rf_snoozer")
    result = await drain(db, router)
    outcomes = sorted((a.type, a.status.value) for a in result.attempts)
    assert outcomes == [("rf_flaky", "FAILED"), ("rf_flaky", "RETRYING"),
                        ("rf_snoozer", "COMPLETED"), ("rf_snoozer", "RETRYING")]  # fmt: skip
    errors = await db.fetch("SELECT error FROM job_attempts WHERE job_type = 'rf_flaky'")
    assert len({r["error"] for r in errors}) == 2  # the tracebacks differ
    rows: list[dict[str, Any]] = [
        dict(r)
        for r in await db.fetch("SELECT type, error_class, error, count FROM recent_failures")
    ]
    assert rows == [
        {"type": "rf_flaky", "error_class": "ConnectionError",
         "error": "ConnectionError: upstream down", "count": 2},
    ]  # fmt: skip
