"""Unique jobs (``unique_for`` / ``unique_key``) and ``meta`` over real HTTP and through
``enqueue()``: the database decides which of many concurrent submits creates the job."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg

from conveyor import Job, JobRouter, enqueue
from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types

from .. import db as tdb
from ..stack import running_stack, wait_for

router = JobRouter()


@router.job("meta_echo")
async def meta_echo(job: Job) -> dict[str, Any]:
    return {"meta": job.meta}


async def _count(url: str, sql: str, *args: Any) -> int:
    conn = await tdb.connect(url)
    try:
        return int(await conn.fetchval(sql, *args))
    finally:
        await conn.close()


async def test_twenty_concurrent_submits_make_one_job_then_a_new_one_after_the_window(
    settings: Settings,
) -> None:
    async with running_stack(settings, maintenance=False) as stack:
        body = {"type": "t", "payload": {"b": 2, "a": 1}, "unique_for": 60}
        answers = await asyncio.gather(*(stack.client.post("/jobs", json=body) for _ in range(20)))
        codes = sorted(r.status_code for r in answers)
        assert codes == [200] * 19 + [201], [r.text for r in answers if r.status_code >= 300]
        ids = {r.json()["id"] for r in answers}
        assert len(ids) == 1
        assert sorted(r.json()["duplicate"] for r in answers) == [False] + [True] * 19
        assert await _count(settings.database_url, "SELECT count(*) FROM jobs") == 1
        # the payload's key order does not matter: canonical JSON
        again = await stack.client.post(
            "/jobs", json={**body, "payload": {"a": 1, "b": 2}, "unique_for": 5}
        )
        assert again.status_code == 200 and again.json()["id"] in ids
        # a finished job still holds the key for the window (Oban: unique for the period)
        conn = await tdb.connect(settings.database_url)
        try:
            await conn.execute("UPDATE jobs SET status = 'COMPLETED', finished_at = now()")
            assert (await stack.client.post("/jobs", json=body)).status_code == 200
            # the window passes: a new job
            await conn.execute("UPDATE job_uniques SET expires_at = now() - interval '1 second'")
        finally:
            await conn.close()
        fresh = await stack.client.post("/jobs", json=body)
        assert fresh.status_code == 201 and fresh.json()["duplicate"] is False
        assert fresh.json()["id"] not in ids
        assert await _count(settings.database_url, "SELECT count(*) FROM jobs") == 2
        # a real (short) window, no clock tricks
        short = {"type": "t", "payload": {"k": "short"}, "unique_for": 0.3}
        first = (await stack.client.post("/jobs", json=short)).json()["id"]
        assert (await stack.client.post("/jobs", json=short)).json()["id"] == first
        await asyncio.sleep(0.35)
        later = await stack.client.post("/jobs", json=short)
        assert later.status_code == 201 and later.json()["id"] != first


async def test_unique_key_scopes_and_batches(settings: Settings) -> None:
    async with running_stack(settings, maintenance=False) as stack:
        c = stack.client
        a = await c.post("/jobs", json={"type": "a", "payload": {"n": 1}, "unique_for": 60,
                                         "unique_key": "invoice-42"})  # fmt: skip
        # another payload with the same key: the same job
        b = await c.post("/jobs", json={"type": "a", "payload": {"n": 2}, "unique_for": 60,
                                         "unique_key": "invoice-42"})  # fmt: skip
        assert (a.status_code, b.status_code) == (201, 200)
        assert b.json()["id"] == a.json()["id"] and b.json()["payload"] == {"n": 1}
        # the key is scoped by type
        other = await c.post(
            "/jobs", json={"type": "b", "unique_for": 60, "unique_key": "invoice-42"}
        )
        assert other.status_code == 201
        # a plain job is never a duplicate
        assert (await c.post("/jobs", json={"type": "a", "payload": {"n": 1}})).status_code == 201

        item = {"type": "c", "payload": {"x": 1}, "unique_for": 60}
        batch = await c.post("/jobs/batch", json={"jobs": [item, {"type": "c"}, item]})
        assert batch.status_code == 201, batch.text
        jobs = batch.json()["jobs"]
        assert [j["duplicate"] for j in jobs] == [False, False, True]
        assert jobs[2]["id"] == jobs[0]["id"] and jobs[1]["id"] != jobs[0]["id"]
        replay = await c.post("/jobs/batch", json={"jobs": [item, item]})
        assert replay.status_code == 200
        assert {j["id"] for j in replay.json()["jobs"]} == {jobs[0]["id"]}
        # with an Idempotency-Key too: the batch is one transaction, all or none
        keyed = await c.post(
            "/jobs/batch", json={"jobs": [item, {"type": "c", "payload": {"y": 1}}]},
            headers={"Idempotency-Key": "batch-1"},
        )  # fmt: skip
        assert keyed.status_code == 201
        assert [j["duplicate"] for j in keyed.json()["jobs"]] == [True, False]
        n = await _count(settings.database_url, "SELECT count(*) FROM jobs WHERE job_type = 'c'")
        assert n == 3


async def test_a_vanished_holder_gives_way(settings: Settings) -> None:
    async with running_stack(settings, maintenance=False) as stack:
        body = {"type": "t", "payload": {"v": 1}, "unique_for": 600}
        first = (await stack.client.post("/jobs", json=body)).json()["id"]
        conn = await tdb.connect(settings.database_url)
        try:  # retention (or an operator) deleted the job while its key was held
            await conn.execute("DELETE FROM job_outbox")
            await conn.execute("DELETE FROM jobs")
        finally:
            await conn.close()
        second = await stack.client.post("/jobs", json=body)
        assert second.status_code == 201 and second.json()["id"] != first
        third = await stack.client.post("/jobs", json=body)
        assert third.status_code == 200 and third.json()["id"] == second.json()["id"]


INVALID: list[dict[str, Any]] = [
    {"unique_key": "k"},  # a key without a window
    {"unique_for": 0},
    {"unique_for": -1},
    {"unique_for": "60"},
    {"unique_for": 60, "unique_key": ""},
    {"meta": [1, 2]},
    {"meta": {"big": "x" * 8200}},
    {"meta": {"nul": "\x00"}},
]


async def test_invalid_options_are_422(settings: Settings) -> None:
    async with running_stack(settings, maintenance=False) as stack:
        for extra in INVALID:
            r = await stack.client.post("/jobs", json={"type": "t", **extra})
            assert r.status_code == 422, (extra, r.text)
            b = await stack.client.post("/jobs/batch", json={"jobs": [{"type": "t", **extra}]})
            assert b.status_code == 422, (extra, b.text)
    assert await _count(settings.database_url, "SELECT count(*) FROM jobs") == 0


async def test_meta_is_stored_returned_and_read_by_the_handler(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        await register_router_types(conn, router)
    finally:
        await conn.close()
    async with running_stack(settings, router) as stack:
        meta = {"tenant": "acme", "trace": [1, 2.5, None], "big": 4.324448394381094e16}
        r = await stack.client.post("/jobs", json={"type": "meta_echo", "meta": meta})
        assert r.status_code == 201 and r.json()["meta"] == meta
        plain = await stack.submit("meta_echo")
        await wait_for(settings.database_url, [r.json()["id"], plain])
        done = (await stack.client.get(f"/jobs/{r.json()['id']}")).json()
        assert done["status"] == "COMPLETED" and done["meta"] == meta
        assert done["result"]["meta"]["trace"] == [1, 2.5, None]
        got = (await stack.client.get(f"/jobs/{plain}")).json()
        assert got["meta"] is None and got["result"] == {"meta": {}}
        assert "duplicate" not in got


async def test_enqueue_waits_for_the_holders_transaction(db_url: str) -> None:
    """Two application transactions enqueue the same unique job: the second waits for the
    first; commit → it returns the first job; rollback → it creates its own."""
    a = await tdb.connect(db_url)
    b = await tdb.connect(db_url)
    try:
        for outcome in ("commit", "rollback"):
            await a.execute("DELETE FROM job_uniques")
            ta = a.transaction()
            await ta.start()
            first = await enqueue(a, "t", {"o": 1}, unique_for=60, meta={"who": outcome})
            second_task = asyncio.create_task(enqueue(b, "t", {"o": 1}, unique_for=60))
            await asyncio.sleep(0.3)
            assert not second_task.done()  # held by a's uncommitted key
            await (ta.commit() if outcome == "commit" else ta.rollback())
            second = await asyncio.wait_for(second_task, 10)
            if outcome == "commit":
                assert second == first
            else:
                assert second != first
                assert await b.fetchval("SELECT count(*) FROM jobs WHERE id = $1", first) == 0
        # one transaction, the same job twice
        async with a.transaction():
            x = await enqueue(a, "t", {"same": True}, unique_for=60, unique_key="k1")
            y = await enqueue(a, "t", {"other": True}, unique_for=60, unique_key="k1")
        assert x == y and isinstance(x, uuid.UUID)
        assert await a.fetchval("SELECT count(*) FROM jobs WHERE id = $1", x) == 1
    finally:
        await a.close()
        await b.close()
