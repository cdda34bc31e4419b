"""Races decided by row locks, in both orders: a workflow cancel against the completion that
releases a job, and against the redrive that brings cancelled dependents back. The first
transaction holds its locks open while the second one waits for them (seen in ``pg_locks``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from conveyor import Workflow, enqueue_workflow
from conveyor.store import Completion

from .. import db as tdb
from .workflow_steps import STORE, claim, complete, fail, ids, outboxed, statuses, workflow_status

Step = Callable[[asyncpg.Connection], Awaitable[Any]]


async def _blocked(db: asyncpg.Connection, pid: int) -> bool:
    return bool(await db.fetchval("SELECT cardinality(pg_blocking_pids($1)) > 0", pid))


async def race(db: asyncpg.Connection, db_url: str, first: Step, second: Step) -> None:
    """``first`` in an open transaction; ``second`` on another connection until it waits for a
    lock ``first`` holds; then ``first`` commits and ``second`` finishes."""
    a, b = await tdb.connect(db_url), await tdb.connect(db_url)
    try:
        tr = a.transaction()
        await tr.start()
        await first(a)
        task = asyncio.create_task(_in_transaction(b, second))
        for _ in range(200):
            if await _blocked(db, b.get_server_pid()):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the second transaction never waited for the first")
        await tr.commit()
        await asyncio.wait_for(task, 10)
    finally:
        await a.close()
        await b.close()


async def _in_transaction(conn: asyncpg.Connection, step: Step) -> None:
    async with conn.transaction():
        await step(conn)


def two_parents() -> Workflow:
    wf = Workflow("race")
    wf.add("p1", "a")
    wf.add("p2", "a")
    wf.add("child", "b", after=["p1", "p2"])
    wf.add("grandchild", "b", after=["child"])
    return wf


async def _setup(db: asyncpg.Connection) -> tuple[uuid.UUID, dict[str, uuid.UUID], int]:
    async with db.transaction():
        wid = await enqueue_workflow(db, two_parents())
    key = await ids(db, wid)
    await complete(db, key["p1"])
    attempt = await claim(db, key["p2"])
    assert attempt is not None
    return wid, key, attempt


async def test_a_release_committed_before_a_workflow_cancel_is_cancelled(
    db: asyncpg.Connection, db_url: str
) -> None:
    wid, key, attempt = await _setup(db)

    async def release(c: asyncpg.Connection) -> None:
        await STORE.job_complete_many(c, [Completion(key["p2"], attempt, "2")])

    await race(db, db_url, release, lambda c: STORE.workflow_cancel(c, wid))
    st = await statuses(db, wid)
    assert st == {"p1": "COMPLETED", "p2": "COMPLETED", "child": "CANCELLED",
                  "grandchild": "CANCELLED"}  # fmt: skip
    assert "child" in await outboxed(db, wid)  # its message finds it CANCELLED: not run
    assert await claim(db, key["child"]) is None
    assert await workflow_status(db, wid) == "CANCELLED"


async def test_a_workflow_cancel_committed_first_leaves_nothing_to_release(
    db: asyncpg.Connection, db_url: str
) -> None:
    wid, key, attempt = await _setup(db)

    async def release(c: asyncpg.Connection) -> None:
        await STORE.job_complete_many(c, [Completion(key["p2"], attempt, "2")])

    await race(db, db_url, lambda c: STORE.workflow_cancel(c, wid), release)
    st = await statuses(db, wid)
    # the running parent was asked to stop: its result is discarded, nothing is released
    assert st == {"p1": "COMPLETED", "p2": "CANCELLED", "child": "CANCELLED",
                  "grandchild": "CANCELLED"}  # fmt: skip
    assert await outboxed(db, wid) == {"p1", "p2"}
    assert (
        await db.fetchval(
            "SELECT count(*) FROM jobs WHERE workflow_id = $1 AND status = 'CANCELLED' "
            "AND started_at IS NOT NULL AND workflow_key = 'child'",
            wid,
        )
        == 0
    )
    assert await workflow_status(db, wid) == "CANCELLED"


@pytest.mark.parametrize("retry_first", [True, False])
async def test_a_retry_racing_a_workflow_cancel(
    db: asyncpg.Connection, db_url: str, retry_first: bool
) -> None:
    async with db.transaction():
        wid = await enqueue_workflow(db, two_parents())
    key = await ids(db, wid)
    await complete(db, key["p1"])
    await fail(db, key["p2"])
    assert (await statuses(db, wid))["child"] == "CANCELLED"

    async def retry(c: asyncpg.Connection) -> None:
        await STORE.job_redrive(c, [key["p2"]])

    async def cancel(c: asyncpg.Connection) -> None:
        await STORE.workflow_cancel(c, wid)

    if retry_first:
        await race(db, db_url, retry, cancel)
        # the retried job and the dependents it brought back are cancelled with the workflow
        expected = {"p2": "CANCELLED", "child": "CANCELLED", "grandchild": "CANCELLED"}
    else:
        await race(db, db_url, cancel, retry)
        # an explicit retry after the cancel runs that job, and only that job
        expected = {"p2": "PENDING", "child": "CANCELLED", "grandchild": "CANCELLED"}
    st = await statuses(db, wid)
    assert {k: st[k] for k in expected} == expected
    assert await workflow_status(db, wid) == "CANCELLED"
    if not retry_first:
        await complete(db, key["p2"])
        st = await statuses(db, wid)
        assert (st["child"], st["grandchild"]) == ("CANCELLED", "CANCELLED")
        assert await workflow_status(db, wid) == "CANCELLED"
