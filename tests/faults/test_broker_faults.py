"""Guarantee 2 against a private RabbitMQ node: the broker restarts mid-run, every connection is
closed, a work queue and a retry holding pen lose their messages. PostgreSQL is the truth; the
reconciler re-publishes what the broker lost, and nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from conveyor.core.config import Settings

from .. import db as tdb
from .apps import router
from .checker import Ledger, check, status_counts
from .harness import (
    WorkerFleet,
    fault_settings,
    purge,
    queue_ready,
    running,
    topology,
    wait_until,
)
from .infra import PrivateRabbit


def _total(counter: object, label: str | None = None) -> int:
    return int(
        sum(
            s.value
            for m in counter.collect()  # type: ignore[attr-defined]
            for s in m.samples
            if s.name.endswith("_total") and (label is None or label in s.labels.values())
        )
    )


def _completed(settings: Settings, n: int) -> Callable[[], Awaitable[bool]]:
    async def done() -> bool:
        return (await status_counts(settings.database_url))["COMPLETED"] >= n

    return done


@pytest.fixture
def rsettings(fsettings: Settings, rabbit: PrivateRabbit) -> Settings:
    return fault_settings(fsettings, amqp_url=rabbit.amqp_url)


@pytest.mark.timeout(180)
async def test_rabbitmq_restart_and_dropped_connections(
    rsettings: Settings, rabbit: PrivateRabbit, ledger: Ledger, tmp_path: Path
) -> None:
    """Two worker processes and an in-loop API/relay/sweeper. Mid-run the node's application
    stops for 2 s and starts again; later every connection is closed by the broker. All jobs,
    including those submitted while the broker was down, complete; no process is restarted.
    The reconciler waits 60 s here: a restart must not lose a message in the first place."""
    rsettings = fault_settings(rsettings, reconcile_after=60.0)
    async with running(rsettings) as stack:
        fleet = WorkerFleet(rsettings, tmp_path, 2, concurrency=4)
        await fleet.ready()
        payload = {"ledger": str(ledger), "sleep": 0.15}
        submitting = asyncio.create_task(
            stack.submit_many(160, "work", lambda i: payload, parallel=8, pace=0.1)
        )
        await wait_until(_completed(rsettings, 20), timeout=30, what="20 jobs done before")
        await asyncio.to_thread(rabbit.restart, 2.0)
        restarted = (await status_counts(rsettings.database_url))["COMPLETED"]
        await submitting
        await stack.submit_many(40, "work", lambda i: payload, parallel=8)
        await wait_until(_completed(rsettings, 170), timeout=60, what="the next batch running")
        await asyncio.to_thread(rabbit.close_all_connections, "fault suite")
        await stack.submit_many(40, "work", lambda i: payload, parallel=8)
        v = await check(rsettings.database_url, stack.accepted, ledger, label="rabbitmq-restart",
                        timeout=90)  # fmt: skip
        assert stack.sweeper is not None
        reconciled = _total(stack.sweeper.metrics.maintenance, "reconciled")
        alive = [p.alive() for p in fleet.slots]
        codes = await fleet.stop()
    v.extra.update(completed_at_restart=restarted, reconciled=reconciled)
    print(f"[faults] rabbitmq restart: {restarted} done when the node came back; reconciler "
          f"re-published {reconciled}")  # fmt: skip
    v.assert_clean()
    assert alive == [True, True] and codes == [0, 0], fleet.logs()
    assert v.total == 240
    assert reconciled == 0, "messages were lost by the restart and had to be reconciled"


@pytest.mark.timeout(120)
async def test_purged_work_queue_and_retry_pen_are_reconciled(
    rabbit: PrivateRabbit, fsettings: Settings, ledger: Ledger
) -> None:
    """40 ``work`` jobs wait in their queue with no worker: the reconciler leaves them alone
    (no flooding). The queue is purged: the reconciler re-publishes exactly those. 20 ``flaky``
    jobs fail once into the 4 s holding pen, which is purged too: re-published as well. Every job
    then completes."""
    settings = fault_settings(
        fsettings, amqp_url=rabbit.amqp_url, reconcile_after=2.0, reconcile_interval=1.0
    )
    top = topology(settings)
    work_q, pen_q = top.work_queue("work"), top.pen_queue(4)
    async with running(settings) as stack:
        assert stack.sweeper is not None
        metrics = stack.sweeper.metrics.maintenance
        await stack.submit_many(40, "work", lambda i: {"ledger": str(ledger)})

        async def all_queued() -> bool:
            return await queue_ready(settings.amqp_url, work_q) == 40

        await wait_until(all_queued, timeout=10, what=f"40 messages in {work_q}")
        db = await tdb.connect(settings.database_url)
        try:  # the backlog is overdue (database clock); two one-step passes (the loop runs too)
            await db.execute(
                "UPDATE jobs SET updated_at = updated_at - make_interval(secs => $1),"
                " run_at = run_at - make_interval(secs => $1)",
                settings.reconcile_after + 1,
            )
        finally:
            await db.close()
        assert [await stack.sweeper.reconcile() for _ in range(2)] == [0, 0]
        assert _total(metrics, "reconciled") == 0, "the reconciler flooded a healthy backlog"
        assert await queue_ready(settings.amqp_url, work_q) == 40
        # no consumer, and the reconciler is idle while all 40 are ready: the count is exact
        purged_work = await asyncio.to_thread(rabbit.purge_queue, work_q)

        await stack.add_worker(router, types=["flaky"], concurrency=8)
        await stack.submit_batch("flaky", [{"ledger": str(ledger)}] * 20)

        async def pen_full() -> bool:
            return await queue_ready(settings.amqp_url, pen_q) == 20

        await wait_until(pen_full, timeout=3.5, interval=0.05, what=f"20 messages in {pen_q}")
        purged_pen = await purge(settings.amqp_url, pen_q)  # within the pen's 4 s TTL

        async def all_republished() -> bool:
            done = (await status_counts(settings.database_url))["COMPLETED"] == 20
            return done and await queue_ready(settings.amqp_url, work_q) == 40

        await wait_until(all_republished, timeout=15, what="purged jobs re-published")
        # counted before a consumer drains the backlog (see test_reconciler_and_a_consumed_backlog)
        reconciled = _total(metrics, "reconciled")
        await stack.add_worker(router, types=["work"], concurrency=8)
        v = await check(settings.database_url, stack.accepted, ledger, label="purged-queues",
                        timeout=40)  # fmt: skip
    v.extra.update(purged_work=purged_work, purged_pen=purged_pen, reconciled=reconciled)
    print(f"[faults] purge: {purged_work} purged from {work_q}, {purged_pen} from {pen_q}; "
          f"reconciler re-published {reconciled}")  # fmt: skip
    v.assert_clean()
    assert purged_work == 40 and purged_pen == 20
    assert reconciled == purged_work + purged_pen, "re-published more than the broker lost"
