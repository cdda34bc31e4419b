"""Gauges refreshed from the database and the broker in one step (no scrape-time queries)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest
from prometheus_client import generate_latest

from conveyor import JobSpec, enqueue_many
from conveyor.core.config import Settings
from conveyor.core.metrics import Metrics
from conveyor.maintenance.gauges import Gauges
from conveyor.maintenance.sweeper import Sweeper
from conveyor.publisher.relay import Relay


@pytest.fixture
async def parts(settings: Settings) -> AsyncIterator[tuple[Metrics, Sweeper, Relay]]:
    metrics = Metrics()
    sweeper = Sweeper(settings, metrics)
    relay = Relay(settings, metrics)
    await sweeper.start()
    await relay.start()
    yield metrics, sweeper, relay
    await relay.close()
    await sweeper.close()


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_jobs_outbox_and_queue_gauges(
    db: asyncpg.Connection, parts: tuple[Metrics, Sweeper, Relay]
) -> None:
    metrics, sweeper, relay = parts
    gauges = Gauges(metrics, sweeper.store, sweeper.pool, sweeper.topology,
                    queue_depth=sweeper._queue_depth)  # fmt: skip
    await enqueue_many(db, [JobSpec("a")] * 3 + [JobSpec("b", delay_seconds=600)])
    await db.execute("UPDATE job_outbox SET created_at = now() - interval '42 s'")
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_jobs", type="a", status="PENDING") == 3
    assert _value(metrics, "conveyor_jobs", type="b", status="SCHEDULED") == 1
    assert _value(metrics, "conveyor_outbox_rows") == 3
    lag = _value(metrics, "conveyor_outbox_lag_seconds")
    assert lag is not None and 42 <= lag < 60

    assert await relay.run_once() == 3
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_outbox_rows") == 0
    assert _value(metrics, "conveyor_outbox_lag_seconds") == 0
    queue = sweeper.topology.work_queue("a")
    assert _value(metrics, "conveyor_queue_messages", queue=queue, state="ready") == 3

    await db.execute("UPDATE jobs SET status = 'CANCELLED' WHERE job_type = 'a'")
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_jobs", type="a", status="PENDING") == 0  # not frozen


# The sweeper refreshes the gauges wherever it runs, so ``conveyor publisher --no-maintenance``
# plus a separate ``conveyor sweeper`` still has them: a conveyor_jobs sample on the sweeper's
# /metrics.


async def test_a_separate_sweeper_refreshes_the_gauges(
    settings: Settings, db: asyncpg.Connection
) -> None:
    import asyncio

    import httpx

    from conveyor.cli import processes as services

    from ..stack import free_port

    await enqueue_many(db, [JobSpec("a")] * 2)
    port = free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(services.run_sweeper(settings, stop, health_port=port))
    try:
        text = ""
        async with httpx.AsyncClient() as client:
            for _ in range(100):
                with contextlib.suppress(httpx.HTTPError):
                    text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
                if 'conveyor_jobs{status="PENDING",type="a"} 2.0' in text:
                    break
                await asyncio.sleep(0.1)
        assert 'conveyor_jobs{status="PENDING",type="a"} 2.0' in text, text[-2000:]
        assert "conveyor_outbox_rows 2.0" in text
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_leases_expired_counts_running_jobs_past_their_lease(
    db: asyncpg.Connection, parts: tuple[Metrics, Sweeper, Relay]
) -> None:
    """The "stuck leases" alert's input (deploy/prometheus/alerts.yml)."""
    metrics, sweeper, _ = parts
    gauges = Gauges(metrics, sweeper.store, sweeper.pool, sweeper.topology)
    await enqueue_many(db, [JobSpec("a")] * 3)
    await db.execute("UPDATE jobs SET status = 'IN_PROGRESS', attempts = 1, "
                     "lease_expires_at = now() + interval '30 s'")  # fmt: skip
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_leases_expired") == 0
    await db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 s' WHERE id IN "
                     "(SELECT id FROM jobs ORDER BY id LIMIT 2)")  # fmt: skip
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_leases_expired") == 2
    await sweeper.recover_leases()
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_leases_expired") == 0


async def test_every_registered_type_has_its_series_from_the_first_refresh(
    db: asyncpg.Connection, parts: tuple[Metrics, Sweeper, Relay]
) -> None:
    """Every registered type has a ``conveyor_jobs`` series per counted status, 0 included,
    from the first refresh: without one, a fresh install's panels say "no data" and
    ``absent()`` alerts fire."""
    metrics, sweeper, _ = parts
    await db.execute("INSERT INTO job_types (name) VALUES ('quiet_type') ON CONFLICT DO NOTHING")
    await enqueue_many(db, [JobSpec("a")])
    gauges = Gauges(metrics, sweeper.store, sweeper.pool, sweeper.topology)
    await gauges.refresh_once()
    counted = ("SCHEDULED", "PENDING", "IN_PROGRESS", "RETRYING", "FAILED")
    for status in counted:
        assert _value(metrics, "conveyor_jobs", type="quiet_type", status=status) == 0, status
        assert _value(metrics, "conveyor_jobs_estimated", type="quiet_type", status=status) == 0
    assert _value(metrics, "conveyor_jobs", type="a", status="PENDING") == 1
    assert _value(metrics, "conveyor_jobs", type="a", status="FAILED") == 0
    registered = await db.fetchval("SELECT count(*) FROM job_types")
    series = {s.labels["type"] for m in metrics.registry.collect() if m.name == "conveyor_jobs"
              for s in m.samples}  # fmt: skip
    assert len(series) == registered, (len(series), registered)


async def test_workflows_by_status(
    db: asyncpg.Connection, parts: tuple[Metrics, Sweeper, Relay]
) -> None:
    """``conveyor_workflows{status}``: every status has its series (0 included) from the first
    refresh, and a workflow that finishes moves from RUNNING to its final status."""
    from conveyor.workflows import Workflow, cancel_workflow, enqueue_workflow

    metrics, sweeper, _ = parts
    gauges = Gauges(metrics, sweeper.store, sweeper.pool, sweeper.topology)
    await gauges.refresh_once()
    for status in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED"):
        assert _value(metrics, "conveyor_workflows", status=status) == 0
    ids = []
    for i in range(3):
        wf = Workflow(f"w{i}")
        wf.add("first", "a")
        wf.add("then", "a", after=["first"])
        ids.append(await enqueue_workflow(db, wf))
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_workflows", status="RUNNING") == 3
    await cancel_workflow(db, ids[0])
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_workflows", status="RUNNING") == 2
    assert _value(metrics, "conveyor_workflows", status="CANCELLED") == 1
    for status in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED"):
        assert _value(metrics, "conveyor_workflows_estimated", status=status) == 0


async def test_workflow_counts_stop_at_the_cap_and_take_the_estimate_above_it(
    db: asyncpg.Connection, parts: tuple[Metrics, Sweeper, Relay]
) -> None:
    """Finished workflows stay until retention deletes them, so their count is the table: each
    status is counted up to the cap and the planner's estimate stands above it (flagged in
    ``conveyor_workflows_estimated``), as the jobs' counts do. A whole count read every
    workflow at each refresh."""
    metrics, sweeper, _ = parts
    await db.execute(
        "INSERT INTO workflows (id, name, on_failure, status, finished_at) "
        "SELECT gen_random_uuid(), 'done', 'cancel', 'COMPLETED', now() "
        "FROM generate_series(1, 400)"
    )
    await db.execute("ANALYZE workflows")
    gauges = Gauges(metrics, sweeper.store, sweeper.pool, sweeper.topology, exact_up_to=50)
    async with sweeper.pool.acquire() as conn:
        assert await sweeper.store.workflow_status_counts(conn, 50) == {
            "RUNNING": 0, "COMPLETED": 50, "FAILED": 0, "CANCELLED": 0,
        }  # fmt: skip
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_workflows_estimated", status="COMPLETED") == 1
    assert _value(metrics, "conveyor_workflows", status="COMPLETED") == 400  # the statistics'
    assert _value(metrics, "conveyor_workflows_estimated", status="RUNNING") == 0
    assert _value(metrics, "conveyor_workflows", status="RUNNING") == 0


async def test_a_process_that_stops_refreshing_exports_none_of_them(
    db: asyncpg.Connection, parts: tuple[Metrics, Sweeper, Relay]
) -> None:
    """The duties moved to another process: this one's last values would read as current (an
    outbox lag of 0 while nothing relays), so its /metrics drops them; it exports them again
    once it refreshes them again."""
    metrics, sweeper, _ = parts
    gauges = Gauges(metrics, sweeper.store, sweeper.pool, sweeper.topology)
    await enqueue_many(db, [JobSpec("a")])
    await gauges.refresh_once()
    text = generate_latest(metrics.registry).decode()
    assert "\nconveyor_outbox_lag_seconds " in text and "\nconveyor_jobs{" in text
    gauges.forget()
    text = generate_latest(metrics.registry).decode()
    for name in ("conveyor_outbox_lag_seconds", "conveyor_outbox_rows", "conveyor_leases_expired"):
        assert f"\n{name} " not in text, name
    assert "\nconveyor_jobs{" not in text and "\nconveyor_workflows{" not in text
    await gauges.refresh_once()
    assert _value(metrics, "conveyor_outbox_rows") == 1
