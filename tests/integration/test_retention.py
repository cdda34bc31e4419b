"""Retention: finished jobs after ``retention_days``, FAILED jobs after
``failed_retention_days`` (not kept for ever), in small batches, attempts with them.
Time is the database's: the test ages rows by rewriting ``finished_at``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper

AGED = """
INSERT INTO jobs (id, job_type, status, priority, payload, attempts, created_at, finished_at)
SELECT gen_random_uuid(), 't', $1::job_status, 5, '{}', 1, now() - make_interval(days => $2),
       now() - make_interval(days => $2)
FROM generate_series(1, $3)
"""


@pytest.fixture
async def sweeper(settings: Settings) -> AsyncIterator[Sweeper]:
    s = Sweeper(settings.model_copy(update={"retention_batch": 7, "retention_pause": 0}))
    await s.start()
    yield s
    await s.close()


async def _left(db: asyncpg.Connection) -> dict[tuple[str, int], int]:
    rows = await db.fetch(
        "SELECT status::text, round(extract(epoch FROM now() - finished_at) / 86400)::int AS d,"
        " count(*) FROM jobs GROUP BY 1, 2"
    )
    return {(r["status"], r["d"]): r["count"] for r in rows}


async def test_failed_jobs_are_kept_30_days_then_deleted_in_batches(
    db: asyncpg.Connection, sweeper: Sweeper
) -> None:
    for status, days, n in [
        ("COMPLETED", 8, 20), ("CANCELLED", 8, 3), ("COMPLETED", 6, 4),
        ("FAILED", 8, 5), ("FAILED", 29, 6), ("FAILED", 31, 17),
    ]:  # fmt: skip
        await db.execute(AGED, status, days, n)
    await db.execute(
        "INSERT INTO job_attempts (job_id, attempt, job_type, finished_at, outcome)"
        " SELECT id, 1, job_type, finished_at, 'completed' FROM jobs"
    )
    batches: list[int] = []
    delete = sweeper.store.job_delete_expired

    async def counted(*args: object, **kwargs: object) -> int:
        n = await delete(*args, **kwargs)  # type: ignore[arg-type]
        batches.append(n)
        return n

    sweeper.store = type(sweeper.store)(sweeper.store.schema)
    sweeper.store.job_delete_expired = counted  # type: ignore[method-assign]
    assert await sweeper.delete_expired() == 20 + 3 + 17
    assert max(batches) == 7 and len(batches) == 6  # 40 rows, 7 a transaction
    assert await _left(db) == {("COMPLETED", 6): 4, ("FAILED", 8): 5, ("FAILED", 29): 6}
    # the attempts went with their jobs
    assert await db.fetchval(
        "SELECT count(*) FROM job_attempts a WHERE NOT EXISTS"
        " (SELECT 1 FROM jobs j WHERE j.id = a.job_id)"
    ) == 0  # fmt: skip
    assert await db.fetchval("SELECT count(*) FROM job_attempts") == 15
    assert await sweeper.delete_expired() == 0  # an idle pass


async def test_failed_retention_is_a_setting(settings: Settings, db: asyncpg.Connection) -> None:
    await db.execute(AGED, "FAILED", 3, 2)
    s = Sweeper(settings.model_copy(update={"failed_retention_days": 2.5}))
    await s.start()
    try:
        assert await s.delete_expired() == 2
    finally:
        await s.close()
