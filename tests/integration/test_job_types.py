"""Bounded job types: a type is known once a worker (or a deploy step) registered it;
the API answers 422 naming the known types for any other, and ``enqueue()`` applies the same
policy, so queues, job rows and metric series stay bounded by what operators deploy — unless
``CONVEYOR_ACCEPT_UNKNOWN_TYPES`` says otherwise."""

from __future__ import annotations

import asyncio
import random
import string
import uuid

import aio_pika
import asyncpg
import pytest

from conveyor import Job, JobRouter, enqueue
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings
from conveyor.core.errors import UnknownJobType
from conveyor.jobs.types import register_router_types
from conveyor.store.connect import with_database

from .. import apps
from ..services import Endpoints
from ..stack import running_stack, wait_for

fresh = JobRouter()


@fresh.job("fresh_type", max_retries=7, timeout=12.5, retry_delays=[3, 30])
async def fresh_handler(job: Job) -> str:
    return "ok"


def _random_type() -> str:
    return "typo_" + "".join(random.choices(string.ascii_lowercase + string.digits, k=12))


async def test_random_types_create_no_job_queue_or_metric_series(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """The API side: 2,000 submits with random types."""
    # 50 at once, each a miss that re-reads the types: the API's fail-fast 1.5 s acquire bound
    # (a 503 by design) is not what this test is about, and the start of a run is busy
    settings = settings.model_copy(update={"db_timeout": 10.0})
    names = [_random_type() for _ in range(2000)]
    async with running_stack(settings, maintenance=False) as stack:
        first = await stack.client.post("/jobs", json={"type": names[0]})
        assert first.status_code == 422, first.text
        body = first.json()
        assert body["error"] == "unknown_job_type"
        assert body["detail"]["type"] == names[0]
        assert "echo" in body["detail"]["known"]
        for i in range(0, len(names), 50):
            answers = await asyncio.gather(
                *(stack.client.post("/jobs", json={"type": t}) for t in names[i : i + 50])
            )
            assert {a.status_code for a in answers} == {422}
        batch = await stack.client.post(
            "/jobs/batch", json={"jobs": [{"type": "echo"}, {"type": names[1]}]}
        )
        assert batch.status_code == 422 and batch.json()["detail"]["type"] == names[1]
        metrics = (await stack.client.get("/metrics")).text
        assert await stack.relay.run_once() == 0
    assert "typo_" not in metrics
    assert await db.fetchval("SELECT count(*) FROM jobs") == 0
    assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        for name in random.sample(names, 5):
            channel = await connection.channel()
            queue = Topology(settings.namespace).work_queue(name)
            with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
                await channel.declare_queue(queue, passive=True)
    finally:
        await connection.close()


async def test_a_worker_registers_its_types_and_the_api_accepts_them_at_once(
    settings: Settings, db: asyncpg.Connection
) -> None:
    async with running_stack(settings, apps.router) as stack:
        assert (await stack.client.post("/jobs", json={"type": "fresh_type"})).status_code == 422
        await stack.add_worker(fresh)  # registers at start; the API re-reads on a miss
        job_id = await stack.submit("fresh_type")
        assert list((await wait_for(settings.database_url, [job_id])).values()) == ["COMPLETED"]
    row = await db.fetchrow(
        "SELECT max_retries, timeout_seconds, retry_delays, first_seen <= last_seen AS ordered"
        " FROM job_types WHERE name = 'fresh_type'"
    )
    assert tuple(row) == (7, 12.5, [3, 30], True)


async def test_the_accept_any_setting_accepts_unknown_types(settings: Settings) -> None:
    open_settings = settings.model_copy(update={"accept_unknown_types": True})
    async with running_stack(open_settings, maintenance=False) as stack:
        answer = await stack.client.post("/jobs", json={"type": _random_type()})
        assert answer.status_code == 201, answer.text


async def test_enqueue_applies_the_same_policy(
    db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UnknownJobType) as info:
        async with db.transaction():
            await enqueue(db, "fresh_type")
    assert "echo" in info.value.known
    await register_router_types(db, fresh)  # a deploy step, without running a worker
    assert await enqueue(db, "fresh_type")
    monkeypatch.setenv("CONVEYOR_ACCEPT_UNKNOWN_TYPES", "true")
    assert await enqueue(db, _random_type())
    assert await db.fetchval("SELECT count(*) FROM jobs") == 2


async def test_enqueue_caches_known_types_per_database(
    db: asyncpg.Connection, endpoints: Endpoints, template_db: str
) -> None:
    """A type registered in one database is not taken as known in another."""
    await register_router_types(db, fresh)
    assert await enqueue(db, "fresh_type")
    other = f"conveyor_types_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(endpoints.database_url)
    await admin.execute(f'CREATE DATABASE "{other}" TEMPLATE "{template_db}"')
    try:
        conn = await asyncpg.connect(with_database(endpoints.database_url, other))
        try:
            with pytest.raises(UnknownJobType):
                await enqueue(conn, "fresh_type")
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')
        await admin.close()
