"""``POST /workflows`` at the largest size allowed (``DEFAULT_MAX_JOBS``: a root, its fan-out and
a fan-in) over real HTTP: its answer lists each of the 10,000 jobs once, and it costs no more
than a few times the same jobs submitted as plain batches (``POST /jobs/batch``) on the same
server, whatever the machine's speed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from conveyor.core.config import Settings
from conveyor.workflows import DEFAULT_MAX_JOBS

from ..stack import Stack, running_stack


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    async with running_stack(settings, None, maintenance=False, relays=0) as s:
        yield s


@pytest.mark.timeout(300)
async def test_a_ten_thousand_job_workflow_costs_a_few_batches_of_the_same_jobs(
    stack: Stack,
) -> None:
    leaves = [f"leaf-{i}" for i in range(DEFAULT_MAX_JOBS - 2)]
    body = {
        "name": "wide",
        "jobs": [
            {"key": "root", "type": "t"},
            *({"key": k, "type": "t", "after": ["root"]} for k in leaves),
            {"key": "sink", "type": "t", "after": leaves},
        ],
    }
    batch = {"jobs": [{"type": "t"} for _ in range(1000)]}

    t = time.perf_counter()
    for _ in range(DEFAULT_MAX_JOBS // 1000):
        r = await stack.client.post("/jobs/batch", json=batch, timeout=120)
        assert r.status_code == 201, r.text[:300]
    batches = time.perf_counter() - t

    t = time.perf_counter()
    r = await stack.client.post("/workflows", json=body, timeout=120)
    took = time.perf_counter() - t

    assert r.status_code == 201, r.text[:300]
    keys = [j["key"] for j in r.json()["jobs"]]
    assert len(keys) == DEFAULT_MAX_JOBS and len(set(keys)) == DEFAULT_MAX_JOBS
    assert (keys[0], keys[-1]) == ("root", "sink")
    print(f"[workflow] 10,000 jobs: {took:.2f} s; as 10 batches of 1,000: {batches:.2f} s")
    assert took < 3 * batches + 1.0, (took, batches)
