"""`conveyor dev` serves one /metrics with the API's, the worker's and the publisher's families,
and the exposition passes `promtool check metrics`."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time

import httpx
import pytest

from conveyor.core.config import Settings

from ..stack import free_port
from .test_processes import CONVEYOR, ROOT, _env

FAMILIES = [
    'conveyor_jobs_submitted_total{type="hello"} 1.0',
    'conveyor_jobs_finished_total{outcome="completed",type="hello"} 1.0',
    'conveyor_job_duration_seconds_count{type="hello"} 1.0',
    'conveyor_job_wait_seconds_count{type="hello"} 1.0',
    'conveyor_outbox_published_total{destination="work"}',
    "conveyor_outbox_rows ",
    "conveyor_outbox_lag_seconds ",
]


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: apt-get install prometheus (.ci/run does)", pytrace=False)
    out = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.timeout(120)
async def test_dev_metrics_show_every_service_and_pass_promtool(settings: Settings) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *CONVEYOR, "dev", "--app", "examples.app:router", "--port", str(port),
        env=_env(settings), cwd=ROOT, stderr=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await client.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "conveyor dev did not get ready"
                await asyncio.sleep(0.1)
            r = await client.post("/jobs", json={"type": "hello", "payload": {"name": "m"}})
            assert r.status_code == 201
            text = ""
            while time.monotonic() < deadline:
                text = (await client.get("/metrics")).text
                if all(f in text for f in FAMILIES):
                    break
                await asyncio.sleep(0.1)
            missing = [f for f in FAMILIES if f not in text]
            assert not missing, missing
            promtool_check(text)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_worker_exports_the_deliveries_it_holds_unacked(
    settings: Settings, db_url: str
) -> None:
    from .. import apps
    from ..stack import running_stack, wait_for

    apps.reset()
    async with running_stack(settings, apps.router, concurrency=4) as stack:
        worker = stack.workers[0]
        queue = worker.topology.work_queue("slow")

        def unacked() -> float | None:
            return worker.metrics.registry.get_sample_value(
                "conveyor_queue_messages", {"queue": queue, "state": "unacked"}
            )

        assert unacked() == 0
        job_id = await stack.submit("slow", {"seconds": 30, "observe_cancel": True})
        await wait_for(db_url, [job_id], statuses=["IN_PROGRESS"], timeout=20)
        assert unacked() == 1
        assert (await stack.client.post(f"/jobs/{job_id}/cancel")).status_code == 200
        await wait_for(db_url, [job_id], timeout=20)
        for _ in range(100):  # the slot is freed right after the outcome's commit
            if unacked() == 0:
                break
            await asyncio.sleep(0.02)
        assert unacked() == 0
