"""The worker's probe endpoint tells a wedged worker from a busy one."""

from __future__ import annotations

import asyncio

import httpx

from conveyor.core.config import Settings
from conveyor.worker import Worker
from conveyor.worker.health import serve_health

from .. import apps
from ..stack import free_port, running_stack, wait_for


async def test_busy_is_healthy_dead_loops_and_lost_broker_are_not(
    settings: Settings, db_url: str
) -> None:
    async with running_stack(settings, None) as stack:
        worker = Worker(settings, apps.router, concurrency=1)
        await worker.start()
        port = free_port()
        server = await serve_health(worker, "127.0.0.1", port, broker_grace=0.3)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                assert (await c.get("/healthz")).status_code == 200
                assert (await c.get("/readyz")).status_code == 200
                # busy: its only slot runs a long job; still healthy
                job = await stack.submit("slow", {"seconds": 3})
                await wait_for(db_url, [job], statuses=["IN_PROGRESS"], timeout=10)
                worker.monitor.tick(worker.clock())  # one step: the snapshot the probe reads
                r = await c.get("/healthz")
                assert r.status_code == 200 and r.json()["running"] == 1
                assert "conveyor_jobs_finished" in (await c.get("/metrics")).text
                await wait_for(db_url, [job], timeout=10)
                # a dead internal loop is a wedged worker
                worker.loops["completer"].cancel()
                await asyncio.gather(worker.loops["completer"], return_exceptions=True)
                worker.monitor.tick(worker.clock())  # refresh the snapshot the probe reads
                r = await c.get("/healthz")
                assert r.status_code == 503 and r.json()["dead_loops"] == ["completer"]
                assert (await c.get("/nope")).status_code == 404
        finally:
            server.close()
            await worker.stop(grace=1)


async def test_broker_down_longer_than_grace_fails_liveness(settings: Settings) -> None:
    worker = Worker(settings, apps.router, concurrency=1)
    await worker.start()
    port = free_port()
    server = await serve_health(worker, "127.0.0.1", port, broker_grace=0.3)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            await worker.subscription.close()  # a robust connection closed for good
            worker.monitor.tick(worker.clock())
            r = await c.get("/healthz")
            assert r.status_code == 200 and r.json()["broker_connected"] is False  # within grace
            assert (await c.get("/readyz")).status_code == 503
            await asyncio.sleep(0.4)  # the grace is measured in wall time
            assert (await c.get("/healthz")).status_code == 503
    finally:
        server.close()
        await worker.stop(grace=1)
