from __future__ import annotations

from conveyor.core.config import Settings
from examples.app import router

from ..stack import running_stack, wait_for


async def test_submitted_job_completes_with_result(settings: Settings, db_url: str) -> None:
    async with running_stack(settings, router) as stack:
        job_id = await stack.submit("hello", {"name": "Ada"})
        await wait_for(db_url, [job_id], timeout=15)
        r = await stack.client.get(f"/jobs/{job_id}")
        body = r.json()
        assert body["status"] == "COMPLETED"
        assert body["result"] == {"greeting": "Hello, Ada!"}
        assert body["attempts"] == 1
        assert body["started_at"] is not None and body["finished_at"] is not None
