"""``GET /jobs/{id}/attempts`` over real HTTP with a real worker, relay and broker."""

from __future__ import annotations

import uuid

import orjson

from conveyor.core.config import Settings

from .. import apps
from ..stack import running_stack, wait_for
from .test_processes import _env, _run


async def test_a_retried_job_shows_both_attempts_oldest_first(
    settings: Settings, db_url: str
) -> None:
    apps.reset()
    async with running_stack(settings, apps.router, concurrency=4) as stack:
        job_id = await stack.submit("flaky", {"succeed_on": 2})
        assert (await wait_for(db_url, [job_id], timeout=30)) == {uuid.UUID(job_id): "COMPLETED"}
        r = await stack.client.get(f"/jobs/{job_id}/attempts")
        assert r.status_code == 200
        attempts = r.json()["attempts"]
        assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "retry"), (2, "completed")]
        assert attempts[0]["error"].startswith("ConnectionError: boom on attempt 1")
        assert attempts[1]["error"] is None
        worker_id = stack.workers[0].worker_id
        assert {a["worker_id"] for a in attempts} == {worker_id}
        assert all(a["duration_seconds"] >= 0 for a in attempts)
        assert attempts[0]["finished_at"] <= attempts[1]["started_at"]

        missing = await stack.client.get(f"/jobs/{uuid.uuid4()}/attempts")
        assert missing.status_code == 404
        assert set(missing.json()) == {"error", "detail"}
        bad = await stack.client.get("/jobs/not-a-uuid/attempts")  # names no job: 404
        assert bad.status_code == 404 and set(bad.json()) == {"error", "detail"}

        code, out, _ = await _run(["jobs", "show", job_id, "--json"], _env(settings))
        assert code == 0
        shown = orjson.loads(out)["attempts"]
        assert [(a["attempt"], a["outcome"]) for a in shown] == [(1, "retry"), (2, "completed")]
        # for a person: the job's fields, then one line per attempt with its error's last line
        code, out, _ = await _run(["jobs", "show", job_id], _env(settings))
        assert code == 0 and f"id         {job_id}" in out and "status     COMPLETED" in out
        table = out[out.index("  #  outcome") :].splitlines()[1:]
        assert [line.split()[:2] for line in table] == [["1", "retry"], ["2", "completed"]]
        assert table[0].endswith("ConnectionError: boom on attempt 1") and worker_id in table[0]
