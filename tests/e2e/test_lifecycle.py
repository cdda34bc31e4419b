"""Jobs through every transition of the status diagram, over real HTTP, PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import asyncpg
import orjson
import pytest

from conveyor.broker.topology import Topology
from conveyor.core.config import Settings

from .. import apps
from ..stack import Stack, running_stack, wait_for


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    apps.reset()
    async with running_stack(settings, apps.router, concurrency=8) as s:
        yield s


async def _job(stack: Stack, job_id: str) -> dict[str, object]:
    r = await stack.client.get(f"/jobs/{job_id}")
    assert r.status_code == 200
    body: dict[str, object] = r.json()
    return body


async def test_500_jobs_rest_and_batch_across_types_and_priorities(
    stack: Stack, db_url: str, db: asyncpg.Connection
) -> None:
    types = ["noop", "echo", "sync_echo"]
    prios = ["high", "normal", "low", 0, 7]
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> str:
        async with sem:
            return await stack.submit(types[i % 3], {"i": i}, priority=prios[i % 5])

    rest = await asyncio.gather(*(one(i) for i in range(250)))
    batch_ids: list[str] = []
    for start in range(0, 250, 125):
        r = await stack.client.post(
            "/jobs/batch",
            json={"jobs": [{"type": types[i % 3], "payload": {"i": i}, "priority": prios[i % 5]}
                           for i in range(start, start + 125)]},
        )  # fmt: skip
        assert r.status_code == 201
        batch_ids += [j["id"] for j in r.json()["jobs"]]
    ids = rest + batch_ids
    statuses = await wait_for(db_url, ids, timeout=60)
    assert set(statuses.values()) == {"COMPLETED"}
    assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0
    assert all(apps.RUNS[i] == 1 for i in ids)
    body = await _job(stack, rest[1])
    assert body["result"] == {"echo": {"i": 1}, "attempt": 1, "priority": 5}
    assert (await _job(stack, rest[2]))["result"] == {"thread": True}


async def test_retry_then_complete(stack: Stack, db_url: str) -> None:
    job_id = await stack.submit("flaky", {"succeed_on": 3})
    await wait_for(db_url, [job_id], timeout=20)
    body = await _job(stack, job_id)
    assert body["status"] == "COMPLETED" and body["attempts"] == 3 and body["retry_count"] == 2
    assert "boom on attempt 2" in str(body["last_error"])


async def test_retries_exhausted_fail_and_dead_letter_then_redrive(
    stack: Stack, db_url: str, settings: Settings
) -> None:
    job_id = await stack.submit("always_fails")
    await wait_for(db_url, [job_id], timeout=20)
    body = await _job(stack, job_id)
    assert body["status"] == "FAILED" and body["attempts"] == 3  # handler's max_retries=2
    assert "always fails (attempt 3)" in str(body["last_error"])
    # a copy with the last error waits in the dead-letter queue
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await conn.channel()
        dlq = await ch.declare_queue(Topology(settings.namespace).dead_letter_queue, passive=True)
        for _ in range(50):
            msg = await dlq.get(no_ack=False, fail=False)
            if msg is not None:
                break
            await asyncio.sleep(0.1)
        assert msg is not None
        dead = orjson.loads(msg.body)
        assert dead["id"] == job_id and "always fails" in dead["error"]
        await msg.nack(requeue=True)
    finally:
        await conn.close()
    # redrive: back to PENDING, fresh retries, attempts keep counting (fencing token)
    r = await stack.client.post(f"/jobs/{job_id}/retry")
    assert r.status_code == 200 and r.json()["status"] in ("PENDING", "IN_PROGRESS", "RETRYING")
    await wait_for(db_url, [job_id], statuses=["FAILED"], timeout=20)
    assert (await _job(stack, job_id))["attempts"] == 6
    # retrying a job that is not FAILED/CANCELLED is a conflict
    ok = await stack.submit("noop")
    await wait_for(db_url, [ok])
    assert (await stack.client.post(f"/jobs/{ok}/retry")).status_code == 409


async def test_submitter_max_retries_wins_over_the_handlers(stack: Stack, db_url: str) -> None:
    job_id = await stack.submit("always_fails", max_retries=0)
    await wait_for(db_url, [job_id], timeout=15)
    body = await _job(stack, job_id)
    assert body["status"] == "FAILED" and body["attempts"] == 1 and body["max_retries"] == 0


async def test_retry_exception_does_not_consume_retries(stack: Stack, db_url: str) -> None:
    job_id = await stack.submit("snooze")  # max_retries=0, yet snoozes twice
    await wait_for(db_url, [job_id], timeout=20)
    body = await _job(stack, job_id)
    assert body["status"] == "COMPLETED" and body["result"] == 3 and body["retry_count"] == 0


async def test_timeouts_fail_async_and_sync_handlers(stack: Stack, db_url: str) -> None:
    a = await stack.submit("sleepy_async")
    s = await stack.submit("sleepy_sync")
    await wait_for(db_url, [a, s], timeout=15)
    for job_id in (a, s):
        body = await _job(stack, job_id)
        assert body["status"] == "FAILED"
        assert "timeout of 0.5 s" in str(body["last_error"])


async def test_scheduled_job_waits_for_run_at(
    stack: Stack, db_url: str, db: asyncpg.Connection
) -> None:
    job_id = await stack.submit("noop", delay_seconds=1.5)
    assert (await _job(stack, job_id))["status"] == "SCHEDULED"
    await wait_for(db_url, [job_id], timeout=10)
    row = await db.fetchrow("SELECT run_at, started_at FROM jobs WHERE id = $1", uuid.UUID(job_id))
    lag = (row["started_at"] - row["run_at"]).total_seconds()
    assert 0 <= lag < 1.0, lag  # never early (database clock), within about a second


async def test_cancel_pending_scheduled_and_running(
    stack: Stack, db_url: str, db: asyncpg.Connection
) -> None:
    scheduled = await stack.submit("noop", delay_seconds=60)
    r = await stack.client.post(f"/jobs/{scheduled}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    running = await stack.submit("slow", {"seconds": 10, "observe_cancel": True})
    await wait_for(db_url, [running], statuses=["IN_PROGRESS"], timeout=10)
    r = await stack.client.post(f"/jobs/{running}/cancel")
    assert r.status_code == 200 and r.json()["cancel_requested"] is True
    await wait_for(db_url, [running], timeout=15)  # the heartbeat tells the handler
    body = await _job(stack, running)
    assert body["status"] == "CANCELLED" and body["result"] is None  # result discarded
    assert (await stack.client.post(f"/jobs/{running}/cancel")).status_code == 409
    # its time comes (database clock) and the sweeper's promotion runs: it stays CANCELLED, its
    # row untouched, and nothing is published for it. (Checked so that each check can fail:
    # the sweeper's own loop may run the promotion first, and the relay deletes an outbox row
    # within milliseconds, so neither promote_due's count nor an empty outbox proves anything;
    # a message for it would reach the worker before a probe submitted after it, and be dropped.)
    row = "SELECT status::text, attempts, updated_at FROM jobs WHERE id = $1"
    await db.execute("UPDATE jobs SET run_at = now() - interval '1 s' WHERE id = $1",
                     uuid.UUID(scheduled))  # fmt: skip
    before = await db.fetchrow(row, uuid.UUID(scheduled))
    dropped = stack.workers[0].metrics.messages_dropped.labels("status_cancelled")
    dropped_before = dropped._value.get()
    assert stack.sweeper is not None
    await stack.sweeper.promote_due()
    probe = await stack.submit("noop")
    await wait_for(db_url, [probe], statuses=["COMPLETED"], timeout=10)
    assert await db.fetchrow(row, uuid.UUID(scheduled)) == before  # status, attempts, updated_at
    assert dropped._value.get() == dropped_before  # no message for it was delivered
    assert apps.RUNS[scheduled] == 0 and apps.RUNS[probe] == 1


async def test_cancelled_pending_job_never_runs(settings: Settings, db_url: str) -> None:
    apps.reset()
    # no worker yet: the job waits in its queue, is cancelled, then a worker arrives
    async with running_stack(settings, None) as stack:
        job_id = await stack.submit("noop")
        assert (await stack.client.post(f"/jobs/{job_id}/cancel")).json()["status"] == "CANCELLED"
        await stack.add_worker(apps.router)
        probe = await stack.submit("noop")
        await wait_for(db_url, [probe])
        assert apps.RUNS[job_id] == 0
        redriven = await stack.client.post(f"/jobs/{job_id}/retry")
        assert redriven.status_code == 200
        await wait_for(db_url, [job_id], statuses=["COMPLETED"])


async def test_priority_under_backlog(settings: Settings, db_url: str) -> None:
    apps.reset()
    async with running_stack(settings, None) as stack:
        r = await stack.client.post(
            "/jobs/batch", json={"jobs": [{"type": "noop", "priority": "low"}] * 300}
        )
        low = [j["id"] for j in r.json()["jobs"]]
        high = await stack.submit("noop", priority="high")
        # let the relay publish everything before a worker starts
        for _ in range(100):
            if not await stack.relay.run_once():
                break
        await stack.add_worker(apps.router, concurrency=4)
        await wait_for(db_url, [*low, high], timeout=30)
        assert apps.ORDER.index(high) < 10, apps.ORDER.index(high)


async def test_long_job_heartbeats_past_the_visibility_timeout(stack: Stack, db_url: str) -> None:
    # visibility timeout is 5 s in tests; this job runs 7 s and must not be taken over
    job_id = await stack.submit("slow", {"seconds": 7})
    await wait_for(db_url, [job_id], timeout=20)
    body = await _job(stack, job_id)
    assert body["status"] == "COMPLETED" and body["attempts"] == 1 and apps.RUNS[job_id] == 1


async def test_cancel_a_retrying_job(stack: Stack, db_url: str) -> None:
    job_id = await stack.submit("retry_later")
    await wait_for(db_url, [job_id], statuses=["RETRYING"], timeout=10)
    r = await stack.client.post(f"/jobs/{job_id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    assert apps.RUNS[job_id] == 1
