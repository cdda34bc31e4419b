"""The completer's one step against the real store: a batch with one outcome PostgreSQL refuses
commits the others, and the refused one becomes a recorded failure."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import orjson

from conveyor import Job, enqueue
from conveyor.core.metrics import Metrics
from conveyor.store import connect, for_schema
from conveyor.store.connect import create_pool
from conveyor.store.roles import grant_statements
from conveyor.worker import outcomes, progress
from conveyor.worker.completer import (
    LARGE_RESULT_CHARS,
    Completer,
    Pending,
    is_data_error,
    is_refusal,
)
from conveyor.worker.followups import build_followup
from conveyor.worker.running import Running

from .. import db as tdb
from ..conftest import RUN_ID


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


@dataclasses.dataclass
class _Held:
    """A completer on a pool of its own, and a connection to hold row locks with."""

    pool: Any
    completer: Completer
    done: list[Pending]
    locker: asyncpg.Connection

    async def drained(self) -> None:
        """Until every outcome waiting (for a lock) is written."""
        deadline = time.monotonic() + 10
        while self.completer.status().waiting:
            assert time.monotonic() < deadline, self.completer.status()
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _held(db_url: str, *, max_size: int) -> AsyncIterator[_Held]:
    pool = await create_pool(db_url, application_name="test-completer", max_size=max_size)
    done: list[Pending] = []

    async def record(batch: list[Pending]) -> None:
        done.extend(batch)

    locker = await tdb.connect(db_url)
    try:
        yield _Held(pool, Completer(pool, for_schema(), Metrics(), done=record), done, locker)
    finally:
        await locker.close()
        await pool.close()


# A 10 MB result must not stall every other outcome write of its worker for seconds: a large
# result is written in a transaction of its own, so the other outcomes do not wait for
# PostgreSQL to parse it. Here the large one's write is held
# by a row lock: flush_once must not wait for it with the small ones uncommitted.


async def test_a_large_result_does_not_hold_back_the_other_outcomes(
    db: asyncpg.Connection, db_url: str
) -> None:
    async with _held(db_url, max_size=3) as h:
        completer, done = h.completer, h.done
        runs = await _claimed(db, 3)
        big = {"blob": "x" * (LARGE_RESULT_CHARS + 1)}
        async with h.locker.transaction():
            await h.locker.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", runs[1].job.id)
            for r, result in zip(runs, [{"ok": 0}, big, {"ok": 2}], strict=True):
                completer.put(r, outcomes.completed(result))
            assert await asyncio.wait_for(completer.flush_once(), 10) == 3
            assert {p.running.job.id for p in done} == {runs[0].job.id, runs[2].job.id}
            assert completer.status().waiting == 1  # the large one, waiting for the lock
        await h.drained()
    statuses = await db.fetch("SELECT status::text FROM jobs ORDER BY id")
    assert [r["status"] for r in statuses] == ["COMPLETED"] * 3
    assert len(done) == 3 and all(p.written for p in done)


# Outcomes written alone hold a connection each while PostgreSQL parses their result: unbounded,
# four of them take a pool of four (the worker's), and the batch of small outcomes waits for a
# connection until they are written. Here their writes are held by row locks: the batch must
# commit while they wait, and they are written once the locks go.


async def test_large_results_written_alone_leave_connections_for_the_batch(
    db: asyncpg.Connection, db_url: str
) -> None:
    async with _held(db_url, max_size=4) as h:
        completer, done, pool = h.completer, h.done, h.pool
        runs = await _claimed(db, 6)
        big, small = runs[:4], runs[4:]
        blob = {"blob": "x" * (LARGE_RESULT_CHARS + 1)}
        async with h.locker.transaction():
            await h.locker.execute(
                "SELECT 1 FROM jobs WHERE id = ANY($1::uuid[]) FOR UPDATE", [r.job.id for r in big]
            )
            for r in big:
                completer.put(r, outcomes.completed(blob))
            assert await asyncio.wait_for(completer.flush_once(), 5) == 4
            for r in small:
                completer.put(r, outcomes.completed({"ok": True}))
            t0 = time.monotonic()
            try:
                assert await asyncio.wait_for(completer.flush_once(), 5) == 2
            except TimeoutError:
                raise AssertionError(
                    f"the batch waited {time.monotonic() - t0:.1f} s for a connection"
                ) from None
            assert {p.running.job.id for p in done} == {r.job.id for r in small}
            assert completer.status().waiting == 4  # the large ones, two of them on a lock
            assert pool.get_size() - pool.get_idle_size() <= 2, "more than half of the pool"
        await h.drained()
    statuses = await db.fetch("SELECT status::text FROM jobs ORDER BY id")
    assert [r["status"] for r in statuses] == ["COMPLETED"] * 6
    assert len(done) == 6 and all(p.written for p in done)


async def test_a_batch_of_one_kind_is_one_statement_without_begin_commit(
    db: asyncpg.Connection, db_url: str
) -> None:
    """Completions alone (no progress report, no follow-up) are one atomic statement: no
    BEGIN/COMMIT round trips. A batch mixing completions and failures is one transaction."""
    queries: list[str] = []

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda r: queries.append(r.query.split()[0].rstrip(";").upper()))

    # as create_pool's: no reset query on release
    pool = await asyncpg.create_pool(
        db_url, min_size=1, max_size=1, init=init, reset=connect._skip_session_reset
    )

    async def record(batch: list[Pending]) -> None:
        pass

    completer = Completer(pool, for_schema(), Metrics(), done=record)
    try:
        runs = await _claimed(db, 6)
        for r in runs[:2]:  # warm-up: asyncpg introspects the statement's types once
            completer.put(r, outcomes.completed({"ok": True}))
        await completer.flush_once()
        queries.clear()
        for r in runs[2:4]:
            completer.put(r, outcomes.completed({"ok": True}))
        assert await completer.flush_once() == 2
        assert queries == ["WITH"], queries  # job_complete_many alone
        queries.clear()
        completer.put(runs[4], outcomes.completed(None))
        completer.put(runs[5], outcomes.failure("no", retry_count=0, max_retries=0, spec=None))
        assert await completer.flush_once() == 2
        assert queries[0] == "BEGIN" and queries[-1] == "COMMIT", queries
    finally:
        await pool.close()
    statuses = sorted(r["s"] for r in await db.fetch("SELECT status::text AS s FROM jobs"))
    assert statuses == ["COMPLETED"] * 5 + ["FAILED"], statuses


async def test_a_lost_connection_mid_statement_retries_the_whole_batch_once(
    db: asyncpg.Connection, db_url: str
) -> None:
    """A batch of one kind runs as one statement outside a transaction: when its connection is
    lost while the statement runs (here: blocked on a row lock, then its backend terminated),
    nothing of it is committed and the retry writes every outcome once, each with exactly one
    attempt row."""
    pool = await create_pool(db_url, application_name="test-completer-lost", max_size=2)
    done: list[Pending] = []

    async def record(batch: list[Pending]) -> None:
        done.extend(batch)

    completer = Completer(pool, for_schema(), Metrics(), done=record)
    locker = await tdb.connect(db_url)
    try:
        runs = await _claimed(db, 4)
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", runs[2].job.id)
        for i, r in enumerate(runs):
            completer.put(r, outcomes.completed({"i": i}))
        flush = asyncio.create_task(completer.flush_once())
        deadline = time.monotonic() + 10
        while not await db.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
            "'test-completer-lost' AND wait_event_type = 'Lock'"
        ):
            assert time.monotonic() < deadline, "the batch never waited on the lock"
            await asyncio.sleep(0.02)
        await tx.rollback()
        assert await asyncio.wait_for(flush, 20) == 4
    finally:
        await locker.close()
        await pool.close()
    assert len(done) == 4 and all(p.written for p in done)
    ids = [r.job.id for r in runs]
    rows = await db.fetch(
        "SELECT j.status::text AS s, count(a.*) AS n FROM jobs j LEFT JOIN job_attempts a "
        "ON a.job_id = j.id WHERE j.id = ANY($1::uuid[]) GROUP BY j.id, j.status",
        ids,
    )
    assert sorted((r["s"], r["n"]) for r in rows) == [("COMPLETED", 1)] * 4, rows


async def test_a_mixed_batch_keeps_progress_follow_ups_and_isolates_a_refused_follow_up(
    db: asyncpg.Connection, db_url: str
) -> None:
    """Completions with a last progress report and with follow-ups, beside a failure, in one
    batch: all written in one transaction. A follow-up PostgreSQL refuses (NUL in jsonb) fails
    only its parent, atomically: no COMPLETED attempt row and no child for it, the others
    keep theirs."""
    store = for_schema()
    pool = await create_pool(db_url, application_name="test-completer-mixed", max_size=2)

    async def record(batch: list[Pending]) -> None:
        pass

    completer = Completer(pool, store, Metrics(), done=record)
    try:
        runs = await _claimed(db, 4)
        runs[0].last_progress = progress.report(runs[0].job.id, runs[0].job.attempt, 70, "most")
        runs[1].followups.append(build_followup("t", {"child": 1}, {}, max_payload_bytes=1 << 20))
        bad = build_followup("t", {"x": 1}, {}, max_payload_bytes=1 << 20)
        runs[2].followups.append(dataclasses.replace(bad, payload_json='{"x": "a\\u0000b"}'))
        for r in runs[:3]:
            completer.put(r, outcomes.completed({"ok": True}))
        completer.put(runs[3], outcomes.failure("no", retry_count=0, max_retries=0, spec=None))
        assert await completer.flush_once() == 4
    finally:
        await pool.close()
    got = {
        r["id"]: (r["status"], r["outcomes"], r["percent"])
        for r in await db.fetch(
            "SELECT j.id, j.status::text AS status, (j.progress->>'percent')::float8 AS percent, "
            "array_agg(a.outcome ORDER BY a.attempt) AS outcomes FROM jobs j "
            "JOIN job_attempts a ON a.job_id = j.id GROUP BY j.id"
        )
    }
    ids = [r.job.id for r in runs]
    assert got[ids[0]] == ("COMPLETED", ["completed"], 70.0), got[ids[0]]
    assert got[ids[1]][:2] == ("COMPLETED", ["completed"]), got[ids[1]]
    assert got[ids[2]][:2] == ("FAILED", ["failed"]), got[ids[2]]
    assert got[ids[3]][:2] == ("FAILED", ["failed"]), got[ids[3]]
    children = await db.fetch("SELECT payload FROM jobs WHERE NOT (id = ANY($1::uuid[]))", ids)
    assert [orjson.loads(r["payload"]) for r in children] == [{"child": 1}], children


def test_refusals_by_the_deployment_are_neither_data_errors_nor_plain_outages() -> None:
    assert is_refusal(asyncpg.exceptions.InsufficientPrivilegeError("x"))
    assert is_refusal(asyncpg.exceptions.UndefinedTableError("x"))
    assert is_refusal(asyncpg.exceptions.UndefinedFunctionError("x"))
    assert is_refusal(asyncpg.exceptions.InvalidCatalogNameError("x"))
    assert not is_data_error(asyncpg.exceptions.InsufficientPrivilegeError("x"))
    assert not is_refusal(asyncpg.exceptions.AdminShutdownError("x"))
    assert not is_refusal(ConnectionResetError())


# A worker whose role lacks a privilege (a grant forgotten in a deploy) must not turn every
# outcome into a failure, nor drop it: the outcomes wait, retried (the worker's liveness fails
# past its deadline) with an error that says what to fix, and are written once it is fixed.


async def test_an_outcome_refused_for_a_missing_privilege_waits_and_is_written_once_granted(
    db: asyncpg.Connection, db_url: str, caplog: Any
) -> None:
    role = f"c{RUN_ID}_refused_worker"
    await db.execute(f"CREATE ROLE {role} LOGIN")
    pool = None
    try:
        for statement in grant_statements("conveyor", {"worker": role}):
            await db.execute(statement)
        await db.execute(f"REVOKE UPDATE ON conveyor.jobs FROM {role}")
        pool = await create_pool(
            tdb.as_role(db_url, role), application_name="test-completer", max_size=2
        )
        done: list[Pending] = []

        async def record(batch: list[Pending]) -> None:
            done.extend(batch)

        completer = Completer(pool, for_schema(), Metrics(), done=record)
        runs = await _claimed(db, 2)
        for r in runs:
            completer.put(r, outcomes.completed({"ok": True}))
        flush = asyncio.create_task(completer.flush_once())
        deadline = time.monotonic() + 10
        while not any("outcome_write_refused" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no refusal logged"
            assert not flush.done(), flush
            await asyncio.sleep(0.05)
        refusal = next(r for r in caplog.records if r.getMessage() == "outcome_write_refused")
        assert refusal.levelname == "ERROR"
        fields = refusal.__dict__["fields"]
        assert "InsufficientPrivilege" in fields["error"] and "grant" in fields["hint"]
        assert completer.status().oldest_since is not None  # counts against liveness
        statuses = await db.fetch("SELECT status::text FROM jobs WHERE id = ANY($1)",
                                  [r.job.id for r in runs])  # fmt: skip
        assert {r["status"] for r in statuses} == {"IN_PROGRESS"}  # waiting, not failed
        await db.execute(f"GRANT UPDATE ON conveyor.jobs TO {role}")
        assert await asyncio.wait_for(flush, 30) == 2
        statuses = await db.fetch("SELECT status::text FROM jobs WHERE id = ANY($1)",
                                  [r.job.id for r in runs])  # fmt: skip
        assert {r["status"] for r in statuses} == {"COMPLETED"}
        assert len(done) == 2 and all(p.written for p in done)
    finally:
        if pool is not None:
            await pool.close()
        await db.execute(f"DROP OWNED BY {role}")
        await db.execute(f"DROP ROLE {role}")


# A completion whose unique follow-up waits for an application's open transaction holds its
# job's row during each try (up to KEY_WAIT_SECONDS), and the heartbeat skips rows held
# elsewhere: tries spaced by the backoff could keep catching the beats, the lease run out, and
# the sweeper take the job (run again, though its handler had completed). Each try the key
# refuses extends the leases of its jobs, once their rows are free again.


async def test_a_completion_held_by_a_key_keeps_its_jobs_lease(
    db: asyncpg.Connection, db_url: str
) -> None:
    from conveyor.worker.followups import KEY_WAIT_SECONDS

    pool = await create_pool(db_url, application_name="test-completer-held", max_size=2)
    app = await tdb.connect(db_url)
    tx = app.transaction()
    completer = Completer(pool, for_schema(), Metrics(), done=_nothing, lease_seconds=600.0)
    flush = None
    try:
        await tx.start()  # the application's transaction holds the key
        await enqueue(app, "t", {"app": 1}, unique_for=300, unique_key="held-key")
        [run] = await _claimed(db, 1)
        await db.execute("UPDATE jobs SET lease_expires_at = now() + interval '20 seconds' "
                         "WHERE id = $1", run.job.id)  # fmt: skip
        run.followups.append(
            build_followup(
                "t",
                {"child": 1},
                {"unique_for": 300, "unique_key": "held-key"},
                max_payload_bytes=1 << 20,
            )
        )
        completer.put(run, outcomes.completed({"ok": True}))
        flush = asyncio.create_task(completer.flush_once())
        deadline = time.monotonic() + 10 + KEY_WAIT_SECONDS
        while completer.status().held == 0:
            assert time.monotonic() < deadline, "never held by the key"
            await asyncio.sleep(0.02)
        left = None
        while time.monotonic() < deadline:
            left = await db.fetchval(
                "SELECT extract(epoch FROM lease_expires_at - now()) FROM jobs WHERE id = $1",
                run.job.id,
            )
            if left > 300:
                break
            await asyncio.sleep(0.05)
        assert left is not None and left > 300, f"the lease was not extended: {left:.0f} s left"
        await tx.rollback()  # the key is free: the completion and its follow-up commit
        assert await asyncio.wait_for(flush, 20) == 1  # (the keyed write goes on in a task)
        deadline = time.monotonic() + 20
        while completer.status().waiting:
            assert time.monotonic() < deadline, completer.status()
            await asyncio.sleep(0.05)
        status = await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", run.job.id)
        assert status == "COMPLETED"
        assert await db.fetchval("SELECT count(*) FROM jobs WHERE payload->>'child' = '1'") == 1
    finally:
        if flush is not None and not flush.done():
            flush.cancel()
        await app.close()
        await pool.close()


async def _nothing(batch: list[Pending]) -> None:
    pass
