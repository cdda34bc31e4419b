"""A slow broker beside the relay's session bound: the relay holds its transaction open (its
batch's outbox rows deleted, uncommitted) while it waits for the broker's confirms, up to its
publish wait. A broker that confirms within that wait but after the session's idle bound (a
memory alarm that clears, a slow disk, a congested link) must not get the batch again: the
bound is for a *paused* relay, not for a healthy one waiting on a slow broker. Measured with a
blackholing proxy on the AMQP link and with a private node's memory alarm (publishers blocked)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from conveyor import enqueue
from conveyor.core.config import Settings
from conveyor.publisher.relay import Relay

from .. import db as tdb
from .harness import drain, queue_ready
from .infra import PrivateRabbit
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


async def _drive(relay: Relay, db_url: str, steps: int) -> tuple[int, list[str]]:
    """Up to ``steps`` relay steps (until one finds nothing): the outbox rows left, the errors."""
    errors: list[str] = []
    for _ in range(steps):
        try:
            if await relay.run_once() == 0:
                break
        except Exception as exc:
            errors.append(type(exc).__name__)
    conn = await tdb.connect(db_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM job_outbox")), errors
    finally:
        await conn.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("alarm", [6.0, 25.0])
async def test_a_memory_alarm_on_a_private_node(
    fsettings: Settings, rabbit: PrivateRabbit, alarm: float
) -> None:
    """A real broker that blocks publishers (RabbitMQ's memory alarm) for ``alarm`` seconds
    after the relay took its batch, the session bounds at their defaults. 6 s (inside the
    publish wait, past the 5 s idle bound): the batch is published once. 25 s (longer than
    the publish wait): the relay's publishes time out and the rows go back to the outbox; the
    relay publishes nothing more until the broker confirms them when the alarm clears, and
    then deletes them: each job's message is in the queue once."""
    settings = fsettings.model_copy(update={"amqp_url": rabbit.amqp_url})
    assert settings.db_idle_in_transaction_timeout == 5.0
    conn = await tdb.connect(settings.database_url)
    try:
        await enqueue(conn, "work", {"warm": True})  # declares the queue before the alarm
    finally:
        await conn.close()
    relay = Relay(settings)
    await relay.start()
    queue = relay.topology.work_queue("work")
    try:
        assert await relay.run_once() == 1
        conn = await tdb.connect(settings.database_url)
        try:
            async with conn.transaction():
                for i in range(5):
                    await enqueue(conn, "work", {"i": i})
        finally:
            await conn.close()
        publish_batch = relay.publisher.publish_batch
        cleared: list[asyncio.Task[str]] = []

        async def alarmed(rows: Sequence[Any], *args: Any) -> list[BaseException | None]:
            if not cleared:
                await asyncio.to_thread(rabbit.ctl, "set_vm_memory_high_watermark", "0.000001")
                loop = asyncio.get_running_loop()
                loop.call_later(
                    alarm - 1,
                    lambda: cleared.append(
                        asyncio.ensure_future(
                            asyncio.to_thread(rabbit.ctl, "set_vm_memory_high_watermark", "0.4")
                        )
                    ),
                )
            return await publish_batch(rows, *args)

        relay.publisher.publish_batch = alarmed  # type: ignore[method-assign]
        started = time.monotonic()
        left, errors = await _drive(relay, settings.database_url, 8)
        while not cleared:
            await asyncio.sleep(0.2)
        await cleared[0]
        left, more = await _drive(relay, settings.database_url, 4)
        took = time.monotonic() - started
        await asyncio.sleep(1)
        queued = await queue_ready(rabbit.amqp_url, queue)
    finally:
        with contextlib.suppress(Exception):
            rabbit.ctl("set_vm_memory_high_watermark", "0.4")
        await relay.close()
    print(f"[faults] memory alarm {alarm:.0f} s: {queued - 1} messages for 5 jobs, outbox left "
          f"{left}, relay errors {errors + more}, {took:.1f} s")  # fmt: skip
    assert left == 0 and queued - 1 == 5


@pytest.mark.timeout(90)
async def test_a_long_memory_alarm_publishes_each_job_once(
    fsettings: Settings, rabbit: PrivateRabbit
) -> None:
    """The relay's own loop, a publish wait of 2 s, under a memory alarm of 16 s: each of its
    publishes waits for confirms the blocked broker does not send. The first batch's frames sit
    in the socket, and the broker routes them when the alarm clears; publishing the same rows
    again every cycle meanwhile queued one more copy of each job per cycle. Once the alarm
    clears every job's message is in its queue once, and the outbox is empty."""
    settings = fsettings.model_copy(update={"amqp_url": rabbit.amqp_url})
    conn = await tdb.connect(settings.database_url)
    try:
        await enqueue(conn, "work", {"warm": True})  # declares the queue before the alarm
    finally:
        await conn.close()
    relay = Relay(settings, publish_timeout=2.0)
    await relay.start()
    queue = relay.topology.work_queue("work")
    stop = asyncio.Event()
    loop_task: asyncio.Task[None] | None = None
    try:
        assert await relay.run_once() == 1
        await drain(rabbit.amqp_url, queue)
        await asyncio.to_thread(rabbit.ctl, "set_vm_memory_high_watermark", "0.000001")
        conn = await tdb.connect(settings.database_url)
        try:
            async with conn.transaction():
                for i in range(5):
                    await enqueue(conn, "work", {"i": i})
            loop_task = asyncio.create_task(relay.run(stop))
            await asyncio.sleep(16)
            await asyncio.to_thread(rabbit.ctl, "set_vm_memory_high_watermark", "0.4")
            t0 = time.monotonic()
            while (
                await conn.fetchval("SELECT count(*) FROM job_outbox")
                and time.monotonic() - t0 < 20
            ):
                await asyncio.sleep(0.2)
            left = await conn.fetchval("SELECT count(*) FROM job_outbox")
        finally:
            await conn.close()
        await asyncio.sleep(1)
        copies = Counter(m.message_id for m in await drain(rabbit.amqp_url, queue))
    finally:
        with contextlib.suppress(Exception):
            rabbit.ctl("set_vm_memory_high_watermark", "0.4")
        stop.set()
        if loop_task is not None:
            await asyncio.wait_for(loop_task, 15)
        await relay.close()
    print(f"[faults] memory alarm 16 s, publish wait 2 s: {sum(copies.values())} messages for "
          f"5 jobs {sorted(copies.values())}, outbox left {left}")  # fmt: skip
    assert left == 0 and len(copies) == 5, (left, copies)
    assert set(copies.values()) == {1}, copies
