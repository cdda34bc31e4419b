"""``conveyor.client``'s workflows against the real stack (API, relay, sweeper, a worker):
``submit_workflow`` then ``wait_workflow`` until the last job ran after the others, the
Idempotency-Key replay and conflict, the job's ``workflow_id`` and ``depends_on`` (``get``,
``list``; None and [] for a plain job), list pages, cancel, the 422 of a cycle, and
``wait_workflow``'s timeout; the sync ``Client`` in a thread."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from conveyor import Job, JobRouter
from conveyor.client import (
    AsyncClient,
    Client,
    Conflict,
    InvalidRequest,
    NotFound,
    WaitTimeout,
    workflow_job,
)
from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types

from ..stack import running_stack

router = JobRouter()


@router.job("wf_square")
async def square(job: Job) -> dict[str, int]:
    return {"square": job.payload["n"] ** 2}


@router.job("wf_sum")
async def total(job: Job) -> dict[str, int]:
    return {"sum": sum(r["square"] for r in job.parents.values())}


async def _register(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await register_router_types(conn, router)
        await conn.execute("INSERT INTO conveyor.job_types (name) VALUES ('wf_idle')")
    finally:
        await conn.close()


MAP_REDUCE = [
    *(workflow_job(f"sq-{n}", "wf_square", {"n": n}) for n in range(1, 4)),
    workflow_job("sum", "wf_sum", after=[f"sq-{n}" for n in range(1, 4)], priority="high"),
]


async def test_async_client_submits_and_waits_for_a_workflow(settings: Settings) -> None:
    await _register(settings.database_url)
    async with (
        running_stack(settings, router) as stack,
        AsyncClient(str(stack.client.base_url)) as c,
    ):
        wf = await c.submit_workflow("squares", MAP_REDUCE, idempotency_key="sq-1")
        assert wf.status == "RUNNING" and wf.jobs["sum"]["status"] == "WAITING"
        again = await c.submit_workflow("squares", MAP_REDUCE, idempotency_key="sq-1")
        assert again.id == wf.id
        with pytest.raises(Conflict):
            await c.submit_workflow("other", MAP_REDUCE, idempotency_key="sq-1")
        done = await c.wait_workflow(wf.id, timeout=30)
        assert done.status == "COMPLETED" and done.counts["completed"] == 4
        result = await c.get(done.jobs["sum"]["id"])
        assert result.result == {"sum": 14}
        squares = {uuid.UUID(wf.jobs[f"sq-{n}"]["id"]) for n in range(1, 4)}
        assert result.workflow_id == wf.id and set(result.depends_on) == squares
        listed = {j.id: j for j in (await c.list(limit=10)).jobs}
        assert listed[result.id].workflow_id == wf.id
        assert set(listed[result.id].depends_on) == squares

        idle = await c.submit_workflow(
            "idle", [workflow_job("a", "wf_idle"), workflow_job("b", "wf_idle", after=["a"])]
        )
        with pytest.raises(WaitTimeout) as late:
            await c.wait_workflow(idle.id, timeout=0.5)
        assert late.value.job.status == "RUNNING" and "workflow" in str(late.value)
        cancelled = await c.cancel_workflow(idle.id)
        assert cancelled.status == "CANCELLED" and cancelled.finished
        assert (await c.wait_workflow(idle.id, timeout=1)).status == "CANCELLED"

        page = await c.list_workflows(limit=1)
        assert [w.id for w in page.workflows] == [idle.id] and page.next_cursor
        rest = await c.list_workflows(limit=5, cursor=page.next_cursor)
        assert [w.id for w in rest.workflows] == [wf.id] and rest.next_cursor is None
        named = await c.list_workflows(name="squares", status="COMPLETED")
        assert [w.id for w in named.workflows] == [wf.id]

        cycle = [workflow_job("a", "wf_idle", after=["b"]), workflow_job("b", "wf_idle",
                                                                      after=["a"])]  # fmt: skip
        with pytest.raises(InvalidRequest) as invalid:
            await c.submit_workflow("cycle", cycle)
        assert invalid.value.error == "invalid_workflow" and "cycle" in invalid.value.detail
        with pytest.raises(NotFound):
            await c.get_workflow(uuid.uuid4())
        plain = await c.get((await c.submit("wf_idle")).id)
        assert (plain.workflow_id, plain.depends_on) == (None, [])


async def test_sync_client_in_a_thread(settings: Settings) -> None:
    await _register(settings.database_url)
    async with running_stack(settings, router) as stack:
        base = str(stack.client.base_url)

        def use() -> tuple[str, object]:
            with Client(base) as c:
                wf = c.submit_workflow("squares", MAP_REDUCE, on_failure="continue")
                done = c.wait_workflow(wf.id, timeout=30)
                assert c.cancel_workflow(wf.id).status == "COMPLETED"  # finished: unchanged
                assert c.list_workflows(status="RUNNING").workflows == []
                return done.status, c.get(done.jobs["sum"]["id"]).result

        assert await asyncio.to_thread(use) == ("COMPLETED", {"sum": 14})
