"""The referee is tested too: a stale attempt that overwrites a completion, a job left PENDING
and an accepted id with no row must all be counted."""

from __future__ import annotations

import uuid

from conveyor import enqueue
from conveyor.core.config import Settings

from .. import db as tdb
from .checker import Ledger, check


async def test_checker_counts_lost_stuck_and_double_completed(
    fsettings: Settings, ledger: Ledger
) -> None:
    conn = await tdb.connect(fsettings.database_url)
    try:
        async with conn.transaction():
            done = await enqueue(conn, "work", {"ledger": str(ledger)})
            pending = await enqueue(conn, "work", {"ledger": str(ledger)})
        await conn.execute("DELETE FROM job_outbox")
        # attempt 1 completes...
        await conn.execute(
            "UPDATE jobs SET status = 'IN_PROGRESS', attempts = 1 WHERE id = $1", done
        )
        await conn.execute(
            """UPDATE jobs SET status = 'COMPLETED', result = '{"attempt": 1}' WHERE id = $1""",
            done,
        )
        # ... then an unfenced writer reopens it and completes it again with a stale result
        await conn.execute(
            "UPDATE jobs SET status = 'IN_PROGRESS', attempts = 2 WHERE id = $1", done
        )
        await conn.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = $1", done)
    finally:
        await conn.close()
    ledger.path.write_text(f"start {done} 1 1\ndone {done} 1 1\n")
    never_written = uuid.uuid4()

    v = await check(
        fsettings.database_url, [done, pending, never_written], ledger,
        label="checker-self-test", timeout=1.0, quiet=0.0,
    )  # fmt: skip
    assert (v.lost, v.stuck, v.double_completed) == (2, 1, 1), v.problems
    assert v.executed == 1 and v.duplicates_executed == 0
    problems = "\n".join(v.problems)
    assert "2 transitions into COMPLETED" in problems
    assert "written after COMPLETED" in problems
    assert "result of attempt 1 stored, attempts=2" in problems
    assert "its handler never finished" in problems
    assert f"lost: accepted job {never_written} has no row" in problems
