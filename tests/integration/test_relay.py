"""The outbox relay against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import orjson
import pytest
from pamqp.commands import Basic

from conveyor import JobSpec, enqueue_many
from conveyor.broker import frames
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings
from conveyor.publisher.relay import Relay

from .. import db as tdb


@pytest.fixture
async def amqp(settings: Settings) -> AsyncIterator[aio_pika.abc.AbstractRobustConnection]:
    conn = await aio_pika.connect_robust(settings.amqp_url)
    yield conn
    await conn.close()


async def _drain(
    channel: aio_pika.abc.AbstractChannel, queue: str
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    q = await channel.declare_queue(queue, passive=True)
    out = []
    while (m := await q.get(no_ack=True, fail=False)) is not None:
        out.append(m)
    return out


async def test_run_once_publishes_declares_and_deletes(
    settings: Settings, db: asyncpg.Connection, amqp: aio_pika.abc.AbstractRobustConnection
) -> None:
    ids = await enqueue_many(
        db, [JobSpec("alpha", priority="high"), JobSpec("alpha"), JobSpec("beta")]
    )
    relay = Relay(settings)
    await relay.start()
    try:
        assert await relay.run_once() == 3
        assert await relay.run_once() == 0
    finally:
        await relay.close()
    assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0
    t = Topology(settings.namespace)
    ch = await amqp.channel()
    alpha = await _drain(ch, t.work_queue("alpha"))
    beta = await _drain(ch, t.work_queue("beta"))
    assert [m.message_id for m in alpha] == [str(ids[0]), str(ids[1])]  # priority 9 first
    assert alpha[0].priority == 9 and alpha[1].priority == 5
    assert alpha[0].delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert orjson.loads(beta[0].body) == {"id": str(ids[2]), "type": "beta"}


async def test_unroutable_message_keeps_its_row_then_recovers(
    settings: Settings, db: asyncpg.Connection, amqp: aio_pika.abc.AbstractRobustConnection
) -> None:
    relay = Relay(settings)
    await relay.start()
    try:
        await enqueue_many(db, [JobSpec("gamma")])
        assert await relay.run_once() == 1
        # the queue disappears behind the relay's back: its cached declaration is now wrong
        ch = await amqp.channel()
        await ch.queue_delete(Topology(settings.namespace).work_queue("gamma"))
        await enqueue_many(db, [JobSpec("gamma")])
        with pytest.raises(Exception, match="could not be published"):
            await relay.run_once()
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 1  # kept, not lost
        assert await relay.run_once() == 1  # declared again, published
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0
        assert len(await _drain(ch, Topology(settings.namespace).work_queue("gamma"))) == 1
    finally:
        await relay.close()


async def test_replicas_never_publish_a_row_twice(
    settings: Settings, db: asyncpg.Connection, amqp: aio_pika.abc.AbstractRobustConnection
) -> None:
    n = 3000
    await enqueue_many(db, [JobSpec("delta") for _ in range(n)])
    relays = [Relay(settings.model_copy(update={"relay_batch": 200})) for _ in range(3)]
    for r in relays:
        await r.start()
    try:

        async def drain(r: Relay) -> int:
            total = 0
            while (k := await r.run_once()) > 0:
                total += k
            return total

        counts = await asyncio.gather(*(drain(r) for r in relays))
    finally:
        for r in relays:
            await r.close()
    assert sum(counts) == n
    ch = await amqp.channel()
    q = await ch.declare_queue(Topology(settings.namespace).work_queue("delta"), passive=True)
    assert q.declaration_result.message_count == n


async def test_notify_wakes_the_loop(
    settings: Settings, db: asyncpg.Connection, amqp: aio_pika.abc.AbstractRobustConnection
) -> None:
    relay = Relay(settings.model_copy(update={"relay_poll_interval": 30}))
    await relay.start()
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        # the loop has listened and turned once (``last_ok`` moves), then waits up to 30 s
        first = relay.last_ok
        for _ in range(500):
            if relay.last_ok != first:
                break
            await asyncio.sleep(0.01)
        assert relay.last_ok != first, "the relay loop never turned"
        await enqueue_many(db, [JobSpec("eps")])
        for _ in range(100):
            if await db.fetchval("SELECT count(*) FROM job_outbox") == 0:
                break
            await asyncio.sleep(0.02)
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0  # well before 30 s
    finally:
        stop.set()
        await task
        await relay.close()


async def test_a_queue_that_cannot_be_declared_holds_back_only_its_own_type(
    settings: Settings,
    db: asyncpg.Connection,
    amqp: aio_pika.abc.AbstractRobustConnection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``<ns>.queue.broken`` already exists with other arguments (made by hand here, as an
    operator or another tool might). Every other type's rows publish; the broken
    type's rows stay in the outbox and are retried with backoff; a log line and a metric name
    the queue and the broker's reason."""
    t = Topology(settings.namespace)
    ch = await amqp.channel()
    await ch.declare_queue(t.work_queue("broken"), durable=True, arguments={"x-max-priority": 3})
    await enqueue_many(db, [JobSpec("broken"), JobSpec("fine"), JobSpec("broken"), JobSpec("ok")])
    now = [1000.0]
    relay = Relay(settings)
    relay.publisher.clock = lambda: now[0]
    await relay.start()
    try:
        assert await relay.run_once() == 2
        waiting = await db.fetch("SELECT job_type FROM job_outbox")
        assert [r["job_type"] for r in waiting] == ["broken", "broken"]  # kept, never lost
        assert len(await _drain(ch, t.work_queue("fine"))) == 1
        assert len(await _drain(ch, t.work_queue("ok"))) == 1
        failed = relay.metrics.declare_failed.labels(
            t.work_queue("broken"), "ChannelPreconditionFailed"
        )
        assert failed._value.get() == 1
        [line] = [r for r in caplog.records if r.getMessage() == "queue_declare_failed"]
        fields = line.fields  # type: ignore[attr-defined]
        assert (
            fields["queue"] == t.work_queue("broken") and "PRECONDITION_FAILED" in fields["reason"]
        )
        # while its backoff runs the type is left alone; other types keep flowing
        await enqueue_many(db, [JobSpec("fine")])
        assert await relay.run_once() == 1
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 2
        assert failed._value.get() == 1
        # the next try fails again: the backoff doubles
        now[0] += 1.1
        assert await relay.run_once() == 0
        assert failed._value.get() == 2
        now[0] += 1.1
        assert relay.publisher.blocked() == (["broken"], [])
        # an operator removes the stale queue: the rows flow at the next try
        await ch.queue_delete(t.work_queue("broken"))
        now[0] += 1.0
        assert await relay.run_once() == 2
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0
        assert len(await _drain(ch, t.work_queue("broken"))) == 2
    finally:
        await relay.close()


async def test_a_pen_that_cannot_be_declared_holds_back_only_its_retries(
    settings: Settings, db: asyncpg.Connection, amqp: aio_pika.abc.AbstractRobustConnection
) -> None:
    """A hand-made ``<ns>.retry.5s`` with another TTL: retries into it wait in the outbox, work
    messages and retries into other pens flow."""
    t = Topology(settings.namespace)
    ch = await amqp.channel()
    await ch.declare_queue(t.pen_queue(5), durable=True, arguments={"x-message-ttl": 1234})
    a, b, c = await enqueue_many(db, [JobSpec("pens"), JobSpec("pens"), JobSpec("pens")])
    await db.execute("DELETE FROM job_outbox WHERE job_id <> $1", a)
    await db.execute(
        "INSERT INTO job_outbox (job_id, job_type, priority, destination, delay_seconds)"
        " VALUES ($1, 'pens', 5, 'retry', 5), ($2, 'pens', 5, 'retry', 7)",
        b,
        c,
    )
    relay = Relay(settings)
    await relay.start()
    try:
        assert await relay.run_once() == 2  # the work message and the 7 s retry
        assert relay.publisher.blocked() == ([], [5])
        assert await relay.run_once() == 0
        left = await db.fetch("SELECT job_id, delay_seconds FROM job_outbox")
        assert [(r["job_id"], r["delay_seconds"]) for r in left] == [(b, 5)]
    finally:
        await relay.close()
    assert len(await _drain(ch, t.pen_queue(7))) == 1


class _HalfBrokenPublisher:
    """The first row's queue cannot be declared, the second row's publish is not confirmed."""

    ready = True

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    def blocked(self) -> tuple[list[str], list[int]]:
        return [], []

    def forget_declarations(self) -> None: ...

    renewed = 0

    async def renew_channel(self) -> None:
        self.renewed += 1

    async def publish_batch(self, rows: list[object]) -> list[BaseException | None]:
        from conveyor.broker.publish import DeclarationFailed, PublishFailed

        return [DeclarationFailed("q", "PRECONDITION_FAILED"), PublishFailed("nack"),
                *[None] * (len(rows) - 2)]  # fmt: skip


# ``outbox_publish_failed`` names the first failed row (here: the one whose queue was refused)
# with that row's own error, not the first error of another row (the first job's id with the
# second job's error).


async def test_a_publish_failure_is_logged_with_its_own_job(
    settings: Settings, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    refused, nacked, fine = await enqueue_many(db, [JobSpec("t"), JobSpec("t"), JobSpec("t")])
    publisher = _HalfBrokenPublisher()
    relay = Relay(settings, publisher=publisher)  # type: ignore[arg-type]
    await relay.start()
    try:
        with caplog.at_level("WARNING", logger="conveyor.publisher"):
            assert await relay.run_once() == 1
    finally:
        await relay.close()
    # a refused publish (not a refused declaration) renews the channel: RabbitMQ went on
    # nacking a long-lived channel after a cluster node died (test_rabbit_cluster.py)
    assert publisher.renewed == 1
    [line] = [r.fields for r in caplog.records if r.msg == "outbox_publish_failed"]  # type: ignore[attr-defined]
    assert (line["job_id"], line["count"]) == (str(nacked), 1), line
    assert "nack" in line["error"], line
    left = await db.fetch("SELECT job_id FROM job_outbox ORDER BY id")
    assert [r["job_id"] for r in left] == [refused, nacked]
    assert fine not in [r["job_id"] for r in left]


async def test_renew_channel_swaps_only_once_the_new_channel_is_open(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.broker.publish import Publisher
    from conveyor.core.metrics import Metrics

    p = Publisher(settings.amqp_url, Topology(namespace), Metrics())
    await p.connect()
    try:
        old = p.channel
        assert old is not None
        await p.renew_channel()
        assert p.channel is not None and p.channel is not old
        assert old.is_closed and p.ready
        # the new channel publishes with confirms
        ch = await p.channel.get_underlay_channel()
        queue = f"{namespace}.renewed"
        await ch.queue_declare(queue, exclusive=True)
        confirm = await ch.basic_publish(b"x", routing_key=queue, mandatory=True, timeout=10)
        assert confirm.name == "Basic.Ack"
        # a new channel that cannot be opened leaves the current one in place
        current = p.channel
        assert p.connection is not None

        async def refuse(**_: object) -> object:
            raise ConnectionError("no channel")

        monkeypatch.setattr(p.connection, "channel", refuse)
        with pytest.raises(ConnectionError):
            await p.renew_channel()
        assert p.channel is current and not current.is_closed

        # nor does one that never opens (a connection waiting to reconnect): bounded, not hung
        async def never(**_: object) -> object:
            await asyncio.Event().wait()
            raise AssertionError

        monkeypatch.setattr(p.connection, "channel", never)
        p.publish_timeout = 0.3
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await p.renew_channel()
        assert time.monotonic() - started < 2
        assert p.channel is current and not current.is_closed
    finally:
        await p.close()


def test_every_destination_is_routed_in_one_place() -> None:
    import uuid

    from conveyor.broker.publish import Publisher
    from conveyor.core.metrics import Metrics
    from conveyor.store import OutboxRow

    t = Topology("ns")
    p = Publisher("amqp://unused", t, Metrics())
    p._exchanges = {"work": "ns.exchange", "dead": "ns.dead"}
    job = uuid.uuid4()

    def row(destination: str, delay: int | None = None) -> OutboxRow:
        return OutboxRow(1, job, "t", 5, destination, delay, "boom", 2)

    work, retry, dead = p.route(row("work")), p.route(row("retry", 7)), p.route(row("dead"))
    assert (work.exchange, work.needs) == ("ns.exchange", (("work", "t"),))
    assert (retry.exchange, retry.needs) == (t.pen_exchange(7), (("work", "t"), ("pen", 7)))
    assert (dead.exchange, dead.needs) == ("ns.dead", ())
    assert orjson.loads(dead.body) == {"id": str(job), "type": "t", "attempt": 2, "error": "boom"}
    assert orjson.loads(work.body) == orjson.loads(retry.body) == {"id": str(job), "type": "t"}


async def test_a_small_batch_is_not_followed_by_an_empty_look_unless_something_may_wait(
    settings: Settings, db: asyncpg.Connection, amqp: aio_pika.abc.AbstractRobustConnection
) -> None:
    """After a batch smaller than ``relay_batch`` the loop waits for the next notification
    instead of looking again at once (a transaction per job at low rates); a notification
    that came while publishing makes it look again, and so does polling without a listener."""
    relay = Relay(settings.model_copy(update={"relay_poll_interval": 30}))
    await relay.start()
    looks: list[int] = []
    take = relay.run_once
    other = await tdb.connect(settings.database_url)  # ``db`` is polled by the test meanwhile

    async def counted() -> int:
        n = await take()
        looks.append(n)
        if n and len(looks) == 2:  # while the first job's batch is published, a second commits
            await enqueue_many(other, [JobSpec("eps")])
        return n

    relay.run_once = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        for _ in range(500):  # listening, one empty look
            if looks:
                break
            await asyncio.sleep(0.01)
        await enqueue_many(db, [JobSpec("eps")])
        for _ in range(200):
            if len(looks) >= 3 and await db.fetchval("SELECT count(*) FROM job_outbox") == 0:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        # the empty look, the first job, at once the second (its notification came while the
        # first was published), then nothing: no empty look after a quiet small batch
        assert looks == [0, 1, 1], looks
    finally:
        stop.set()
        await task
        await relay.close()
        await other.close()


async def test_without_a_listener_a_small_batch_is_followed_by_another_look(
    settings: Settings, db: asyncpg.Connection
) -> None:
    relay = Relay(settings.model_copy(update={"relay_poll_interval": 30}))
    await relay.start()
    assert relay._listener is None
    await enqueue_many(db, [JobSpec("eps")])
    assert await relay.run_once() == 1
    assert relay._look_again()  # polling: rows may have arrived unannounced
    await relay.close()


class _AlarmedPublisher:
    """A broker whose confirms do not come within the publish wait (a resource alarm): each
    publish returns ``Unconfirmed`` with a confirm the test settles; ``writable`` is what the
    broker's connection.blocked / unblocked said last."""

    publish_timeout = 0.2
    writable_now = False

    def __init__(self) -> None:
        self.published: list[list[int]] = []
        self.confirms: dict[int, asyncio.Future[object]] = {}

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    def blocked(self) -> tuple[list[str], list[int]]:
        return [], []

    async def writable(self) -> bool:
        return self.writable_now

    async def publish_batch(self, rows: list[Any]) -> list[BaseException | None]:
        self.published.append([r.id for r in rows])
        loop = asyncio.get_running_loop()
        for r in rows:
            self.confirms[r.id] = loop.create_future()
        return [frames.Unconfirmed(self.publish_timeout, self.confirms[r.id]) for r in rows]


async def test_rows_whose_confirms_are_late_are_not_published_again_while_the_broker_blocks(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """Confirms later than the publish wait: the rows go back to the outbox, and nothing is
    published while the connection is blocked (before: every cycle published the same rows
    again). Once the confirms come, the acked row is deleted and only the nacked one goes
    again; a confirm that never comes on a connection that is not blocked is lost: its row is
    published again."""
    await enqueue_many(db, [JobSpec("t"), JobSpec("t")])
    a, b = [r["id"] for r in await db.fetch("SELECT id FROM job_outbox ORDER BY id")]
    publisher = _AlarmedPublisher()
    relay = Relay(settings, publisher=publisher)  # type: ignore[arg-type]
    await relay.start()
    try:
        assert await relay.run_once() == 0
        assert [await relay.run_once() for _ in range(3)] == [0, 0, 0]  # blocked: waits
        assert publisher.published == [[a, b]]
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 2  # kept meanwhile
        publisher.confirms[a].set_result(Basic.Ack(delivery_tag=1))
        publisher.confirms[b].set_exception(frames.PublishFailed("nack"))
        assert await relay.run_once() == 0
        assert publisher.published == [[a, b], [b]]
        assert [r["id"] for r in await db.fetch("SELECT id FROM job_outbox")] == [b]
        publisher.writable_now = True  # unblocked, and b's confirm never comes
        assert await relay.run_once() == 0
        assert publisher.published == [[a, b], [b], [b]]
    finally:
        await relay.close()
