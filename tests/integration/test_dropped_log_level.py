"""Duplicate deliveries are routine: logged at debug, never info; a delivery for a
job PostgreSQL does not know is a warning."""

from __future__ import annotations

import itertools
import logging
import uuid

import asyncpg
import orjson
import pytest

from conveyor import enqueue
from conveyor.core.config import Settings
from conveyor.worker import Worker

from .. import apps


class _Delivery:
    _tags = itertools.count(2_000_000)

    def __init__(self, job_id: uuid.UUID) -> None:
        self.body = orjson.dumps({"id": str(job_id), "type": "noop"})
        self.routing_key, self.message_id, self.channel = "noop", None, None
        self.delivery_tag = next(self._tags)
        self.acks = 0

    async def ack(self, multiple: bool = False) -> None:
        self.acks += 1

    async def reject(self, requeue: bool = False) -> None: ...

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None: ...


async def test_duplicates_at_debug_unknown_jobs_at_warning(
    settings: Settings, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    async with db.transaction():
        job_id = await enqueue(db, "noop")
        await db.execute("DELETE FROM job_outbox")  # the deliveries below stand for its message
    worker = Worker(settings, apps.router, concurrency=4)
    await worker.start()
    try:
        batch = [_Delivery(job_id), _Delivery(job_id), _Delivery(uuid.uuid4())]
        for _ in batch:
            await worker.slots.acquire()
        with caplog.at_level(logging.DEBUG, logger="conveyor.worker"):
            await worker.process_batch(batch)  # type: ignore[arg-type]
    finally:
        await worker.stop(grace=2)
    dropped = [r for r in caplog.records if r.getMessage() == "message_dropped"]
    # one duplicate (its job is running: debug), one unknown job (warning)
    assert sorted(r.levelname for r in dropped) == ["DEBUG", "WARNING"]
    assert all(r.levelno != logging.INFO for r in caplog.records if "dropped" in r.getMessage())
    assert [d.acks for d in batch] == [1, 1, 1]
