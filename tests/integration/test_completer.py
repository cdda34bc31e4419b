"""The completer's one step against the real store: a batch with one outcome PostgreSQL refuses
commits the others, and the refused one becomes a recorded failure (issue 8 item 2)."""

from __future__ import annotations

import time
from typing import Any

import asyncpg

from conveyor import enqueue
from conveyor.core.metrics import Metrics
from conveyor.router import Job
from conveyor.store import for_schema
from conveyor.store.connect import create_pool
from conveyor.worker import outcomes
from conveyor.worker.completer import Completer, Pending, is_data_error
from conveyor.worker.running import Running


async def _claimed(db: asyncpg.Connection, n: int) -> list[Running]:
    ids = [await enqueue(db, "t", {"i": i}, max_retries=0) for i in range(n)]
    rows = await for_schema().job_claim_many(
        db, ids, lease_seconds=30.0, worker_id="test-worker", types=["t"],
        handler_defaults={}, default_max_retries=3,
    )  # fmt: skip
    by_id = {r.id: r for r in rows}
    return [
        Running(Job(i, "t", {}, by_id[i].attempts, 5, 0, 0), None, None, time.monotonic())
        for i in ids
    ]


async def test_one_refused_outcome_does_not_hold_back_its_batch(
    db: asyncpg.Connection, db_url: str
) -> None:
    pool = await create_pool(db_url, application_name="test-completer", max_size=2)
    done: list[Pending] = []

    async def record(batch: list[Pending]) -> None:
        done.extend(batch)

    completer = Completer(pool, for_schema(), Metrics(), done=record)
    try:
        runs = await _claimed(db, 5)
        results: list[Any] = [{"ok": 0}, {"ok": 1}, {"text": "a\x00b"}, {"ok": 3}, "four"]
        for r, result in zip(runs, results, strict=True):
            completer.put(r, outcomes.completed(result))
        assert completer.status().waiting == 5
        assert await completer.flush_once() == 5
    finally:
        await pool.close()
    rows = {
        r["id"]: r
        for r in await db.fetch(
            "SELECT id, status::text AS status, result::text AS result, last_error FROM jobs"
        )
    }
    statuses = [rows[r.job.id]["status"] for r in runs]
    assert statuses == ["COMPLETED", "COMPLETED", "FAILED", "COMPLETED", "COMPLETED"], statuses
    bad = rows[runs[2].job.id]
    assert bad["result"] is None and "result could not be stored" in bad["last_error"]
    assert all(p.written for p in done) and len(done) == 5
    status = completer.status()
    assert (status.waiting, status.unwritable_total, status.written_total) == (0, 1, 5)


def test_data_errors_and_outages_are_told_apart() -> None:
    assert is_data_error(asyncpg.exceptions.UntranslatableCharacterError("x"))
    assert is_data_error(asyncpg.exceptions.CharacterNotInRepertoireError("x"))
    assert is_data_error(asyncpg.exceptions.StringDataRightTruncationError("x"))
    assert is_data_error(asyncpg.exceptions.InvalidTextRepresentationError("x"))
    assert is_data_error(asyncpg.exceptions.ProgramLimitExceededError("x"))
    assert is_data_error(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))
    assert not is_data_error(ConnectionResetError())
    assert not is_data_error(TimeoutError())
    assert not is_data_error(asyncpg.exceptions.AdminShutdownError("x"))
    assert not is_data_error(asyncpg.exceptions.CannotConnectNowError("x"))
    assert not is_data_error(asyncpg.exceptions.InterfaceError("x"))
    assert not is_data_error(OSError())
