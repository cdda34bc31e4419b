"""The reconciler against real services (guarantee 2: "re-publishes jobs whose message was lost
... without flooding a long backlog with duplicates"): a backlog that is sitting in its queue, or
being consumed, lost nothing, so nothing may be re-published."""

from __future__ import annotations

import uuid

import aio_pika
import asyncpg
import orjson
import pytest

from conveyor.broker.topology import Topology
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper

from .. import db as tdb
from .apps import router
from .checker import Ledger, check
from .harness import fault_settings, purge, queue_ready, running, topology, wait_until

# The failure this guards against: Sweeper.reconcile counts overdue jobs first and reads
# the queue's ready count second; a message delivered in between (ready -1, its job still PENDING
# when counted) looks lost, and JOB_REPUBLISH_OVERDUE then re-publishes some other job still
# sitting in the queue
# The failure this guards against: a delivery a worker holds before its claim (waiting
# for a slot, possible once running jobs' deliveries were acked early) is not 'ready', yet its job
# is PENDING and overdue: every reconcile pass re-publishes duplicates of those jobs


async def _age(db: asyncpg.Connection, seconds: float) -> None:
    """Time passes for the reconciler: every job was last touched ``seconds`` earlier."""
    await db.execute(
        "UPDATE jobs SET updated_at = updated_at - make_interval(secs => $1),"
        " run_at = run_at - make_interval(secs => $1)",
        seconds,
    )


def _total(counter: object, label: str | None = None) -> int:
    return int(
        sum(
            s.value
            for m in counter.collect()  # type: ignore[attr-defined]
            for s in m.samples
            if s.name.endswith("_total") and (label is None or label in s.labels.values())
        )
    )


async def test_reconcile_reads_the_queue_before_counting_jobs(
    fsettings: Settings, ledger: Ledger
) -> None:
    """Ten overdue jobs sit in their queue. Exactly while the reconciler looks at the queue, a
    worker takes one delivery and claims its job (``reconcile(queue_depth=...)`` stages it).
    Nothing was lost: nothing may be re-published."""
    settings = fault_settings(fsettings, reconcile_after=0.5)
    work_q = topology(settings).work_queue("work")
    async with running(settings, sweeper=False) as stack:
        await stack.submit_many(10, "work", lambda i: {"ledger": str(ledger)})

        async def all_queued() -> bool:
            return await queue_ready(settings.amqp_url, work_q) == 10

        await wait_until(all_queued, timeout=10, what="10 messages queued")
        amqp = await aio_pika.connect(settings.amqp_url)
        db = await tdb.connect(settings.database_url)
        await _age(db, settings.reconcile_after + 1)  # overdue, on the database's clock
        sweeper = Sweeper(settings)
        await sweeper.start()
        held: list[aio_pika.abc.AbstractIncomingMessage] = []
        try:
            channel = await amqp.channel()

            async def depth(job_type: str) -> int:
                queue = await channel.declare_queue(work_q, passive=True)
                msg = await queue.get(no_ack=False)  # a worker's delivery...
                assert msg is not None
                held.append(msg)
                job_id = uuid.UUID(orjson.loads(msg.body)["id"])
                await db.execute(  # ... and its claim
                    "UPDATE jobs SET status = 'IN_PROGRESS', attempts = attempts + 1"
                    " WHERE id = $1 AND status = 'PENDING'",
                    job_id,
                )
                queue = await channel.declare_queue(work_q, passive=True)
                return int(queue.declaration_result.message_count or 0)

            # two passes (one alone never re-publishes: the first only marks suspects)
            republished = sum([await sweeper.reconcile(queue_depth=depth) for _ in range(2)])
            # hand the staged claim back and let a real worker finish everything
            for msg in held:
                await db.execute(
                    "UPDATE jobs SET status = 'PENDING' WHERE id = $1",
                    uuid.UUID(orjson.loads(msg.body)["id"]),
                )
                await msg.nack(requeue=True)
        finally:
            await sweeper.close()
            await db.close()
            await amqp.close()
        await stack.add_worker(router, types=["work"], concurrency=4)
        v = await check(settings.database_url, stack.accepted, ledger, label="reconcile-order")
        v.extra["republished"] = republished
    print(f"[faults] reconcile order: re-published {republished} of 10 jobs, none was lost")
    v.assert_clean()
    assert republished == 0, f"{republished} duplicates of jobs whose message was never lost"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "early_ack",
    [
        pytest.param(False, id="acked-at-outcome"),
        pytest.param(True, id="acked-early"),
    ],
)
async def test_reconciler_and_a_consumed_backlog(
    fsettings: Settings, ledger: Ledger, early_ack: bool
) -> None:
    """A backlog older than ``reconcile_after`` that a worker is steadily consuming lost no
    message: the reconciler must re-publish nothing. ``acked-early``: the jobs outlive
    ``early_ack_after``, so their deliveries are acked while they run and the broker hands the
    worker more than it can claim at once."""
    overrides: dict[str, float] = {"reconcile_after": 1.0, "reconcile_interval": 0.5}
    if early_ack:
        overrides["early_ack_after"] = 0.2
    settings = fault_settings(fsettings, **overrides)
    work_q = topology(settings).work_queue("work")
    n, sleep = (12, 1.0) if early_ack else (24, 0.5)
    async with running(settings) as stack:
        assert stack.sweeper is not None
        metrics = stack.sweeper.metrics.maintenance
        await stack.submit_many(n, "work", lambda i: {"ledger": str(ledger), "sleep": sleep})

        async def all_queued() -> bool:
            return await queue_ready(settings.amqp_url, work_q) == n

        await wait_until(all_queued, timeout=10, what="the backlog in its queue")
        db = await tdb.connect(settings.database_url)
        try:
            await _age(db, settings.reconcile_after + 1)  # the backlog is overdue
        finally:
            await db.close()
        for _ in range(2):  # two passes of the one-step reconciler (the loop runs too)
            await stack.sweeper.reconcile()
        idle = _total(metrics, "reconciled")
        await stack.add_worker(router, types=["work"], concurrency=2)
        label = "consumed-backlog" + ("-early-ack" if early_ack else "")
        v = await check(settings.database_url, stack.accepted, ledger, label=label, timeout=40)
        reconciled = _total(metrics, "reconciled")
        dropped = _total(stack.workers[0].metrics.messages_dropped)
    v.extra.update(reconciled_idle=idle, reconciled_while_consumed=reconciled - idle,
                   duplicate_deliveries_dropped=dropped)  # fmt: skip
    print(f"[faults] {label}: reconciler re-published {idle} while idle, "
          f"{reconciled - idle} while a worker consumed it; worker dropped {dropped}")  # fmt: skip
    v.assert_clean()
    assert idle == 0, "the reconciler flooded a backlog that sat in its queue"
    assert reconciled == 0, f"{reconciled} duplicates of jobs whose message was never lost"


# Only the ready messages beyond the type's fresh jobs can stand for overdue ones: compared with
# every ready message of the type, fresh messages (not overdue) would stand for a lost one
@pytest.mark.timeout(60)
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_lost_message_behind_fresh_ones_is_republished(
    fsettings: Settings, ledger: Ledger, queue_type: str
) -> None:
    """One job's message is lost and the job is overdue; meanwhile three fresh jobs of the same
    type wait in the queue (a busy type's queue is rarely empty). Nothing stands for the lost
    job: the two passes must re-publish it. (A queue that never drains below the number of
    overdue jobs would otherwise keep it lost for as long as the traffic lasts.) Two of the
    fresh jobs are high-priority: in quorum mode they wait in the type's other band, and the
    depth (both bands) and the fresh count (the type's jobs) still match."""
    settings = fault_settings(fsettings, reconcile_after=5.0, queue_type=queue_type)
    queues = Topology(settings.namespace, settings.queue_type).work_queues("work")
    async with running(settings, sweeper=False) as stack:

        async def ready(n: int) -> bool:
            return sum([await queue_ready(settings.amqp_url, q) for q in queues]) == n

        lost = await stack.submit("work", {"ledger": str(ledger)})
        await wait_until(lambda: ready(1), timeout=10, what="the job's message")
        for q in queues:
            await purge(settings.amqp_url, q)  # lost
        db = await tdb.connect(settings.database_url)
        await _age(db, settings.reconcile_after + 1)  # and overdue
        await stack.submit("work", {"ledger": str(ledger)})
        for _ in range(2):
            await stack.submit("work", {"ledger": str(ledger)}, priority="high")
        await wait_until(lambda: ready(3), timeout=10, what="three fresh messages")
        if queue_type == "quorum":  # the high band holds two of them
            assert await queue_ready(settings.amqp_url, queues[0]) == 2
        sweeper = Sweeper(settings)
        await sweeper.start()
        try:
            republished = [await sweeper.reconcile() for _ in range(2)]
            row = await db.fetchrow(
                "SELECT status::text AS status, updated_at > now() - interval '5 s' AS touched"
                " FROM jobs WHERE id = $1",
                uuid.UUID(lost),
            )
        finally:
            await sweeper.close()
            await db.close()
    assert republished == [0, 1], f"lost job not re-published: {republished}"
    assert row is not None and row["touched"], dict(row or {})  # it was the one re-published
