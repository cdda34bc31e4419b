"""A slow broker beside the relay's session bound: the relay holds its transaction open (its
batch's outbox rows deleted, uncommitted) while it waits for the broker's confirms, up to its
publish wait. A broker that confirms within that wait but after the session's idle bound (a
memory alarm that clears, a slow disk, a congested link) must not get the batch again: the
bound is for a *paused* relay, not for a healthy one waiting on a slow broker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from conveyor import enqueue
from conveyor.core.config import Settings
from conveyor.publisher.relay import Relay

from .. import db as tdb
from .harness import queue_ready
from .proxy import Proxy


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=(auth + "@" if auth else "") + f"127.0.0.1:{port}"))


@pytest.mark.timeout(60)
async def test_confirms_later_than_the_idle_bound_publish_the_batch_once(
    fsettings: Settings,
) -> None:
    """The relay's AMQP link holds every byte for ``bound + 2`` s after the batch is taken (the
    proxy), well inside the publish wait (10 s): the confirms come late but come. The batch is
    committed once and each job's message is in its queue once."""
    bound = 2.0
    amqp = urlsplit(fsettings.amqp_url)
    proxy = Proxy(amqp.hostname or "127.0.0.1", amqp.port or 5672)
    port = await proxy.start()
    settings = fsettings.model_copy(update={
        "amqp_url": _through(fsettings.amqp_url, port),
        "db_idle_in_transaction_timeout": bound,
    })  # fmt: skip
    conn = await tdb.connect(fsettings.database_url)
    try:
        async with conn.transaction():
            for i in range(5):
                await enqueue(conn, "work", {"i": i})
    finally:
        await conn.close()

    relay = Relay(settings)
    publish_batch = relay.publisher.publish_batch
    slowed = 0

    async def slow_broker(rows: Sequence[Any], *args: Any) -> list[BaseException | None]:
        nonlocal slowed
        if slowed == 0:
            proxy.blackhole()
            asyncio.get_running_loop().call_later(bound + 2, proxy.heal)
        slowed += 1
        return await publish_batch(rows, *args)

    relay.publisher.publish_batch = slow_broker  # type: ignore[method-assign]
    await relay.start()
    errors: list[str] = []
    try:
        for _ in range(4):
            try:
                if await relay.run_once() == 0:
                    break
            except Exception as exc:
                errors.append(repr(exc)[:120])
        conn = await tdb.connect(fsettings.database_url)
        try:
            left = await conn.fetchval("SELECT count(*) FROM job_outbox")
        finally:
            await conn.close()
        queued = await queue_ready(fsettings.amqp_url, relay.topology.work_queue("work"))
    finally:
        await relay.close()
        await proxy.close()
    print(f"[faults] slow broker: {slowed} batches published, {queued} messages for 5 jobs, "
          f"errors {errors}")  # fmt: skip
    assert left == 0
    assert (queued, errors) == (5, [])
