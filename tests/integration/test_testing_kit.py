"""``conveyor.testing`` as an application uses it: the example shop's own suite in a subprocess
(no broker reachable at all), and the edges of ``drain`` and the assertions against the real
database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from conveyor import Job, JobRouter, Retry, enqueue
from conveyor.core.jobs import Status
from conveyor.store import for_schema
from conveyor.testing import (
    all_enqueued,
    assert_enqueued,
    drain,
    refute_enqueued,
    register_types,
    run_job,
)
from tests.db import connect
from tests.stack import free_port

SHOP = Path(__file__).resolve().parents[2] / "examples" / "shop"

router = JobRouter()
seen: list[int] = []


@router.job("kit_ok")
async def kit_ok(job: Job) -> dict[str, Any]:
    seen.append(job.attempt)
    return {"echo": job.payload}


@router.job("kit_flaky", max_retries=3, retry_delays=[600])
def kit_flaky(job: Job) -> str:
    if job.attempt < 3:
        raise ConnectionError(f"attempt {job.attempt} fails")
    return "third time lucky"


@router.job("kit_forever")
async def kit_forever(job: Job) -> None:
    job.enqueue("kit_forever", {"n": job.payload["n"] + 1})


@router.job("kit_unique_parent")
async def kit_unique_parent(job: Job) -> None:
    job.enqueue("kit_ok", {"child": True}, unique_for=60, unique_key="only-one")


@router.job("kit_slow", timeout=0.2, max_retries=0)
async def kit_slow(job: Job) -> None:
    await asyncio.sleep(30)


@router.job("kit_asks_again", max_retries=0)
async def kit_asks_again(job: Job) -> str:
    if job.attempt == 1:
        raise Retry(delay=300, reason="not yet")
    return "done"


@pytest.fixture
async def pool(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    # no broker anywhere: nothing in a drain may need one
    monkeypatch.setenv("CONVEYOR_AMQP_URL", f"amqp://guest:guest@127.0.0.1:{free_port()}/")
    p = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    async with p.acquire() as conn:
        await register_types(conn, router)
    seen.clear()
    yield p
    await p.close()


def test_the_example_shops_own_suite_passes_without_a_broker(db_url: str) -> None:
    env = {**os.environ, "CONVEYOR_TEST_DATABASE_URL": db_url,
           "CONVEYOR_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{free_port()}/"}  # fmt: skip
    env.pop("CONVEYOR_DB_SCHEMA", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=SHOP, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "7 passed" in proc.stdout, proc.stdout[-2000:]


async def test_drain_writes_outcomes_as_a_worker_does(pool: Any, db_url: str) -> None:
    async with pool.acquire() as conn:
        ok = await enqueue(conn, "kit_ok", {"a": 1})
        flaky = await enqueue(conn, "kit_flaky", {})
    result = await drain(pool, router)
    assert result.completed == 2 and result.retried == 2 and result.failed == 0
    assert [a.outcome for a in result.of(flaky)] == ["retry", "retry", "completed"]
    db = await connect(db_url)
    try:
        row = await db.fetchrow("SELECT status::text, result, attempts, retry_count, "
                                "lease_expires_at FROM jobs WHERE id = $1", flaky)  # fmt: skip
        assert (row["status"], row["result"], row["attempts"], row["retry_count"]) == (
            "COMPLETED", '"third time lucky"', 3, 2)  # fmt: skip
        assert row["lease_expires_at"] is None
        history = await db.fetch("SELECT outcome FROM job_attempts WHERE job_id = $1 "
                                 "ORDER BY attempt", flaky)  # fmt: skip
        assert [h["outcome"] for h in history] == ["retry", "retry", "completed"]
        assert await db.fetchval("SELECT result->'echo'->>'a' FROM jobs WHERE id = $1", ok) == "1"
    finally:
        await db.close()


async def test_a_job_not_due_yet_is_not_drained(pool: Any) -> None:
    async with pool.acquire() as conn:
        later = await enqueue(conn, "kit_ok", {"later": True}, delay_seconds=3600)
    result = await drain(pool, router)
    assert result.attempts == [] and seen == []
    async with pool.acquire() as conn:
        [waiting] = await assert_enqueued(conn, "kit_ok", payload={"later": True})
    assert waiting.id == later and waiting.status is Status.SCHEDULED


async def test_a_retry_delay_is_kept_when_asked(pool: Any) -> None:
    async with pool.acquire() as conn:
        job_id = await enqueue(conn, "kit_flaky", {})
    result = await drain(pool, router, skip_retry_delay=False)
    assert [a.status for a in result.attempts] == [Status.RETRYING]
    async with pool.acquire() as conn:
        [row] = await assert_enqueued(conn, "kit_flaky")
    assert row.id == job_id and row.status is Status.RETRYING


async def test_drain_stops_at_max_jobs_for_a_job_that_reenqueues_itself(pool: Any) -> None:
    async with pool.acquire() as conn:
        await enqueue(conn, "kit_forever", {"n": 0})
    result = await drain(pool, router, max_jobs=5)
    assert len(result.attempts) == 5 and result.completed == 5 and result.limited
    async with pool.acquire() as conn:
        await assert_enqueued(conn, "kit_forever", payload={"n": 5}, count=1)
    assert not (await drain(pool, router, max_jobs=1, with_follow_ups=False)).limited


async def test_a_timeout_fails_the_attempt(pool: Any) -> None:
    async with pool.acquire() as conn:
        await enqueue(conn, "kit_slow", {})
    result = await asyncio.wait_for(drain(pool, router), 10)
    [attempt] = result.attempts
    assert attempt.status is Status.FAILED
    assert "exceeded its timeout of 0.2 s" in (attempt.error or "")


async def test_retry_asked_by_the_handler_consumes_no_retry(pool: Any) -> None:
    async with pool.acquire() as conn:
        await enqueue(conn, "kit_asks_again", {})
    result = await drain(pool, router)
    assert [a.status for a in result.attempts] == [Status.RETRYING, Status.COMPLETED]


async def test_drain_runs_only_the_types_asked(pool: Any) -> None:
    async with pool.acquire() as conn:
        await enqueue(conn, "kit_ok", {})
        await enqueue(conn, "kit_forever", {"n": 0})
    result = await drain(pool, router, types=["kit_ok"])
    assert [a.type for a in result.attempts] == ["kit_ok"]
    with pytest.raises(ValueError, match="no handler registered for nope"):
        await drain(pool, router, types=["nope"])


async def test_assertions_say_what_is_waiting(pool: Any) -> None:
    async with pool.acquire() as conn:
        await enqueue(conn, "kit_ok", {"to": "ann", "n": 1}, meta={"tenant": "t1"},
                      unique_for=60, unique_key="ann-1")  # fmt: skip
        await assert_enqueued(conn, "kit_ok", payload={"to": "ann"}, meta={"tenant": "t1"})
        await assert_enqueued(conn, "kit_ok", unique_key="ann-1", count=1)
        await refute_enqueued(conn, "kit_ok", unique_key="ann-2")
        with pytest.raises(AssertionError, match=r"found 0; waiting 'kit_ok' jobs: payload=\{"):
            await assert_enqueued(conn, "kit_ok", payload={"to": "bob"})
        with pytest.raises(AssertionError, match="expected 2 waiting"):
            await assert_enqueued(conn, "kit_ok", count=2)
        with pytest.raises(AssertionError, match="expected no waiting 'kit_ok' with payload"):
            await refute_enqueued(conn, "kit_ok", payload={"n": 1})
        assert [j.job_type for j in await all_enqueued(conn)] == ["kit_ok"]


async def test_a_keyed_follow_up_commits_inside_the_callers_transaction(pool: Any) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, "kit_unique_parent", {})
        await enqueue(conn, "kit_unique_parent", {})
        result = await drain(conn, router, types=["kit_unique_parent"])
        assert result.completed == 2
        await assert_enqueued(conn, "kit_ok", unique_key="only-one", count=1)
        tx_rows = await all_enqueued(conn)
    assert [j.job_type for j in tx_rows] == ["kit_ok"]


async def test_a_job_another_worker_claims_first_is_not_run(
    pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with pool.acquire() as conn:
        await enqueue(conn, "kit_ok", {})
    store = for_schema("conveyor")

    async def claimed_elsewhere(*args: Any, **kwargs: Any) -> list[Any]:
        return []  # a worker took it between the drain's pick and its claim

    monkeypatch.setattr(store, "job_claim_many", claimed_elsewhere)
    result = await asyncio.wait_for(drain(pool, router), 10)
    assert result.attempts == [] and seen == [] and not result.limited


async def test_run_job_calls_a_sync_handler_and_lets_its_error_through() -> None:
    with pytest.raises(ConnectionError, match="attempt 1 fails"):
        await run_job(router, "kit_flaky", {})
    assert (await run_job(router, "kit_flaky", {}, attempt=3)).result == "third time lucky"
    call = await run_job(router, "kit_forever", {"n": 4})
    assert [(j.type, j.payload) for j in call.enqueued] == [("kit_forever", {"n": 5})]
    with pytest.raises(LookupError, match="no handler registered for job type 'nope'"):
        await run_job(router, "nope")
