"""``job.set_progress`` (fenced, rate-limited, shown by GET /jobs/{id}) and ``job.enqueue``
(follow-ups committed with the attempt's COMPLETED transition, only if it completes), through a
real worker, plus ``router.middleware`` around real handler calls."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import asyncpg
import orjson

from conveyor import Job, enqueue
from conveyor.api.models import JobResource
from conveyor.api.ui.render import job_detail
from conveyor.core.config import Settings
from conveyor.core.metrics import Metrics
from conveyor.store import ProgressReport, for_schema
from conveyor.store.connect import create_pool
from conveyor.worker import outcomes
from conveyor.worker.completer import Completer, Pending
from conveyor.worker.followups import build_followup
from conveyor.worker.running import Running

from ..stack import running_stack, wait_for
from . import feature_apps as apps


def _fast(settings: Settings) -> Settings:
    return settings.model_copy(update={"type_refresh_interval": 0.2, "progress_interval": 0.5})


async def _progress_of(stack: object, job_id: str, want: float, timeout: float = 5) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = (await stack.client.get(f"/jobs/{job_id}")).json()  # type: ignore[attr-defined]
        p = body.get("progress")
        if p is not None and p["percent"] == want:
            return body
        assert time.monotonic() < deadline, f"progress never reached {want}: {body}"
        await asyncio.sleep(0.05)


async def test_progress_is_shown_while_the_job_runs(settings: Settings) -> None:
    apps.GATE.clear()
    async with running_stack(_fast(settings), apps.router, concurrency=4) as stack:
        a = await stack.submit("f_progress_async")
        s = await stack.submit("f_progress_sync")
        body = await _progress_of(stack, a, 50)
        assert body["status"] == "IN_PROGRESS"
        assert body["progress"]["message"] == "half way" and body["progress"]["updated_at"]
        body = await _progress_of(stack, s, 75)
        assert body["progress"]["message"] == "from a thread"
        apps.GATE.set()
        await wait_for(settings.database_url, [a, s], ["COMPLETED"])
        done = (await stack.client.get(f"/jobs/{a}")).json()
        assert done["progress"]["percent"] == 50  # the last report stays with the job
        unreported = await stack.submit("f_child", {"of": "x"})
        await wait_for(settings.database_url, [unreported], ["COMPLETED"])
        assert (await stack.client.get(f"/jobs/{unreported}")).json()["progress"] is None


async def test_progress_writes_are_rate_limited_last_value_wins(settings: Settings) -> None:
    async with running_stack(_fast(settings), apps.router, concurrency=2) as stack:
        started = time.monotonic()
        job_id = await stack.submit("f_chatty", {"seconds": 2.0})
        await wait_for(settings.database_url, [job_id], ["COMPLETED"])
        elapsed = time.monotonic() - started
        body = (await stack.client.get(f"/jobs/{job_id}")).json()
        reports = body["result"]
        writer = stack.workers[0].progress
    # the report not yet written when the handler returned went with its completion
    assert body["progress"]["message"] == f"step {reports}"
    assert reports > 100  # the handler reported hundreds of times...
    assert writer.written_total <= elapsed / 0.5 + 2  # ...at most one write per 0.5 s


async def test_a_stale_attempts_progress_is_ignored(db: asyncpg.Connection, db_url: str) -> None:
    store = for_schema()
    job_id = await enqueue(db, "t", {})
    await db.execute("UPDATE jobs SET status = 'IN_PROGRESS', attempts = 2 WHERE id = $1", job_id)
    stale = ProgressReport(job_id, 1, 90.0, "stale")
    assert await store.job_progress_many(db, [stale]) == set()
    assert await db.fetchval("SELECT progress FROM jobs WHERE id = $1", job_id) is None
    current = ProgressReport(job_id, 2, 20.0, None)
    assert await store.job_progress_many(db, [current]) == {job_id}
    row = await store.job_get(db, job_id)
    assert row is not None and row.progress is not None and row.progress["percent"] == 20
    shown = JobResource.from_row(row).model_dump(mode="json")  # what `conveyor jobs show` prints
    assert shown["progress"]["percent"] == 20 and shown["progress"]["message"] is None
    await store.job_progress_many(db, [ProgressReport(job_id, 2, 30.0, "<b>rows</b>")])
    page = job_detail(await store.job_get(db, job_id), [])  # type: ignore[arg-type]
    assert "30 % — &lt;b&gt;rows&lt;/b&gt;" in page  # the dashboard's job page, escaped
    env = {**os.environ, "CONVEYOR_DATABASE_URL": db_url}
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "conveyor.cli", "jobs", "show", "--json", str(job_id)],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    shown = orjson.loads(out.stdout)["progress"]
    assert (shown["percent"], shown["message"]) == (30, "<b>rows</b>")


async def test_follow_ups_commit_with_the_completion_and_middleware_wraps_calls(
    settings: Settings, db: asyncpg.Connection
) -> None:
    apps.SEEN.clear()
    async with running_stack(_fast(settings), apps.router, concurrency=4) as stack:
        ok = await stack.submit("f_parent", {"wrap": True})
        fails = await stack.submit("f_parent", {"fail": True})
        sync = await stack.submit("f_sync_parent")
        await wait_for(settings.database_url, [ok], ["COMPLETED"])
        await wait_for(settings.database_url, [fails], ["FAILED"])
        await wait_for(settings.database_url, [sync], ["COMPLETED"])
        result = (await stack.client.get(f"/jobs/{ok}")).json()["result"]["wrapped"]
        assert result["unknown_refused"] is True  # refused at call time
        sync_child = (await stack.client.get(f"/jobs/{sync}")).json()["result"]
        kids = await wait_for(settings.database_url, [*result["children"], sync_child],
                              ["COMPLETED"])  # fmt: skip
        assert len(kids) == 4
        parents = await db.fetch(
            "SELECT payload->>'of' AS of, count(*) AS n FROM jobs WHERE job_type = 'f_child' "
            "GROUP BY 1"
        )
        assert {r["of"]: r["n"] for r in parents} == {ok: 3, sync: 1}  # none for the failure
        prio = await db.fetchval(
            "SELECT priority FROM jobs WHERE id = $1", uuid.UUID(result["children"][2])
        )
        assert prio == 9
    assert f"f_parent:1" in apps.SEEN and "f_sync_parent:1" in apps.SEEN  # noqa: F541
    assert apps.SEEN.count("f_child:1") == 4


async def test_a_cancelled_parent_leaves_no_follow_up(
    settings: Settings, db: asyncpg.Connection
) -> None:
    async with running_stack(_fast(settings), apps.router, concurrency=2) as stack:
        job_id = await stack.submit("f_parent", {"wait_cancel": True})
        await wait_for(settings.database_url, [job_id], ["IN_PROGRESS"])
        assert (await stack.client.post(f"/jobs/{job_id}/cancel")).status_code == 200
        await wait_for(settings.database_url, [job_id], ["CANCELLED"])
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE job_type = 'f_child'") == 0


async def test_a_stale_attempts_completion_is_fenced_and_leaves_no_follow_up(
    db: asyncpg.Connection, db_url: str
) -> None:
    """Attempt 1 loses its lease and attempt 2 takes over; attempt 1's completion (with its
    follow-up) is fenced off and inserts nothing; attempt 2's inserts its own."""
    store = for_schema()
    job_id = await enqueue(db, "t", {})

    async def claim() -> int:
        rows = await store.job_claim_many(
            db, [job_id], lease_seconds=30.0, worker_id="w", types=["t"], handler_defaults={},
            default_max_retries=3,
        )  # fmt: skip
        return rows[0].attempts

    first = await claim()
    await db.execute("UPDATE jobs SET status = 'PENDING' WHERE id = $1", job_id)  # lease lost
    second = await claim()
    pool = await create_pool(db_url, application_name="test-followups", max_size=2)
    done: list[Pending] = []

    async def record(batch: list[Pending]) -> None:
        done.extend(batch)

    completer = Completer(pool, store, Metrics(), done=record)
    try:
        for attempt in (first, second):
            run = Running(Job(job_id, "t", {}, attempt, 5, 0, 3), None, None, time.monotonic())
            run.followups.append(build_followup("t", {"from": attempt}, {},
                                                max_payload_bytes=1 << 20))  # fmt: skip
            completer.put(run, outcomes.completed({"attempt": attempt}))
            await completer.flush_once()
    finally:
        await pool.close()
    assert [p.written for p in done] == [False, True]
    rows = await db.fetch("SELECT payload->>'from' AS f FROM jobs WHERE id <> $1", job_id)
    assert [r["f"] for r in rows] == [str(second)]
    assert await db.fetchval("SELECT count(*) FROM job_outbox WHERE job_id <> $1", job_id) == 1


async def test_follow_ups_keep_meta_and_unique_keys(db: asyncpg.Connection, db_url: str) -> None:
    """Follow-ups with unique jobs and meta take the full insert: the plain one has no columns
    for ``meta`` or a unique key (meta would be NULL, and ``unique_for`` make two children)."""
    store = for_schema()
    parents = [await enqueue(db, "t", {"p": i}) for i in range(2)]
    rows = await store.job_claim_many(
        db, parents, lease_seconds=30.0, worker_id="w", types=["t"], handler_defaults={},
        default_max_retries=3,
    )  # fmt: skip
    pool = await create_pool(db_url, application_name="test-followups", max_size=2)
    completer = Completer(pool, store, Metrics(), done=lambda batch: asyncio.sleep(0))
    try:
        for row in rows:
            run = Running(Job(row.id, "t", {}, row.attempts, 5, 0, 3), None, None,
                          time.monotonic())  # fmt: skip
            options = {"meta": {"tenant": "acme"}, "unique_for": 60}
            run.followups.append(build_followup("t", {"child": True}, options,
                                                max_payload_bytes=1 << 20))  # fmt: skip
            completer.put(run, outcomes.completed(None))
        await completer.flush_once()
        while not completer.idle:  # keyed follow-ups are written beside the batch, each alone
            await asyncio.sleep(0.01)
    finally:
        await pool.close()
    children = await db.fetch("SELECT meta FROM jobs WHERE payload ? 'child'")
    assert len(children) == 1  # the second parent's child was a duplicate within 60 s
    assert orjson.loads(children[0]["meta"]) == {"tenant": "acme"}
