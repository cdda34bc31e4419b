"""Guarantee 4's last line: a job that runs longer than RabbitMQ's ``consumer_timeout`` still
works. A private node with ``consumer_timeout = 3 s``, checked on every channel tick: once a
second here (``channel_tick_interval``; RabbitMQ's default is once a minute, which made this job
run 65 s), so the 10 s job outlives the timeout threefold and meets seven checks. Without the
early ack the broker closes the channel about 4 s in and redelivers; with it the broker never
sees an overdue delivery, which the redelivery counter proves."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from conveyor.core.config import Settings

from .. import apps
from .. import db as tdb
from ..stack import running_stack, wait_for
from .infra import PrivateRabbit


@pytest.fixture(scope="module")
def short_timeout_rabbit() -> Iterator[PrivateRabbit]:
    node = PrivateRabbit(consumer_timeout_ms=3000, channel_tick_ms=1000)
    node.start()
    yield node
    node.stop()


@pytest.mark.timeout(120)
async def test_job_longer_than_consumer_timeout_completes_once(
    settings: Settings, db_url: str, short_timeout_rabbit: PrivateRabbit
) -> None:
    apps.reset()
    s = settings.model_copy(
        update={"amqp_url": short_timeout_rabbit.amqp_url, "early_ack_after": 2.0}
    )
    async with running_stack(s, apps.router, concurrency=2) as stack:
        job_id = await stack.submit("slow", {"seconds": 10}, timeout_seconds=60)
        await wait_for(db_url, [job_id], timeout=60)
        worker = stack.workers[0]
        dropped = sum(
            sample.value
            for metric in worker.metrics.messages_dropped.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        )
        # the worker still consumes after the broker's timeout check ran
        probe = await stack.submit("noop")
        await wait_for(db_url, [probe], timeout=20)
    conn = await tdb.connect(db_url)
    try:
        row = await conn.fetchrow(
            "SELECT status::text, attempts, result::text FROM jobs WHERE id = $1",
            uuid.UUID(job_id),
        )
    finally:
        await conn.close()
    print(f"[faults] long-job: status={row['status']} attempts={row['attempts']} "
          f"runs={apps.RUNS[job_id]} redeliveries_dropped={dropped}")  # fmt: skip
    assert (row["status"], row["attempts"], row["result"]) == ("COMPLETED", 1, '"done"')
    assert apps.RUNS[job_id] == 1
    assert dropped == 0  # no redelivery: the broker never closed the channel on this delivery
    await asyncio.sleep(0)
