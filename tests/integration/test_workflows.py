"""Workflows on a real database: WAITING jobs have no outbox row; the transaction that completes
a job's last dependency releases it; the failure policies; a retry brings cancelled dependents
back; cancel_workflow; the workflow's status; maintenance leaves WAITING jobs alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from conveyor import (
    Job,
    JobRouter,
    JobSpec,
    Workflow,
    cancel_workflow,
    chain,
    chord,
    enqueue_many,
    enqueue_workflow,
    group,
)
from conveyor.core.errors import InvalidJob, PayloadTooLarge
from conveyor.jobs.types import register_router_types
from conveyor.store import Attempt, Completion
from conveyor.testing import drain
from conveyor.workflows import get_workflow

from .. import db as tdb
from .workflow_steps import (
    STORE,
    claim,
    complete,
    fail,
    ids,
    outboxed,
    statuses,
    workflow_status,
)


def diamond(on_failure: str = "cancel") -> Workflow:
    wf = Workflow("nightly-report", on_failure=on_failure)
    fetch = wf.add("fetch", "a", {"day": "2026-11-25"})
    parts = [wf.add(f"part-{i}", "b", {"i": i}, after=[fetch]) for i in range(3)]
    wf.add("report", "c", {}, after=parts, priority="high", max_retries=5)
    return wf


async def submit(db: asyncpg.Connection, wf: Workflow) -> Any:
    async with db.transaction():
        return await enqueue_workflow(db, wf)


async def test_waiting_jobs_have_no_outbox_row_until_released(db: asyncpg.Connection) -> None:
    wid = await submit(db, diamond())
    assert await statuses(db, wid) == {
        "fetch": "PENDING",
        "part-0": "WAITING",
        "part-1": "WAITING",
        "part-2": "WAITING",
        "report": "WAITING",
    }
    assert await outboxed(db, wid) == {"fetch"}
    assert await db.fetchval("SELECT count(*) FROM job_outbox") == 1
    assert await workflow_status(db, wid) == "RUNNING"
    row = await db.fetchrow("SELECT priority, max_retries, deps_pending FROM jobs "
                            "WHERE workflow_key = 'report'")  # fmt: skip
    assert tuple(row) == (9, 5, 3)


async def test_release_happens_in_the_completing_transaction(
    db: asyncpg.Connection, db_url: str
) -> None:
    wid = await submit(db, diamond())
    key = await ids(db, wid)
    other = await tdb.connect(db_url)
    try:
        async with db.transaction():
            await complete(db, key["fetch"], {"rows": 3})
            # released inside the completing transaction, invisible to others until it commits
            assert set((await statuses(db, wid)).values()) >= {"PENDING"}
            assert await outboxed(db, wid) >= {"part-0", "part-1", "part-2"}
            assert (await statuses(other, wid))["part-0"] == "WAITING"
        assert await outboxed(other, wid) == {"fetch", "part-0", "part-1", "part-2"}
        for i in range(3):
            await complete(db, key[f"part-{i}"], i)
            expected = "PENDING" if i == 2 else "WAITING"
            assert (await statuses(db, wid))["report"] == expected
        await complete(db, key["report"], "done")
        assert await workflow_status(db, wid) == "COMPLETED"
        finished = await db.fetchval("SELECT finished_at FROM workflows WHERE id = $1", wid)
        assert finished is not None
    finally:
        await other.close()


async def test_a_rolled_back_submit_writes_nothing(db: asyncpg.Connection) -> None:
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await enqueue_workflow(db, diamond())
            raise RuntimeError("the caller changed its mind")
    for table in ("jobs", "job_outbox", "workflows", "job_dependencies"):
        assert await db.fetchval(f"SELECT count(*) FROM {table}") == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda wf: wf.add("x", "a", after=["nope"]), "waits for 'nope'"),
        (lambda wf: (wf.add("x", "a", after=["y"]), wf.add("y", "a", after=["x"])), "cycle"),
        (lambda wf: (wf.add("x", "a"), wf.add("x", "a")), "already has a job with key 'x'"),
        (lambda wf: wf.add("x", "not a type!"), "workflow job 'x': job type"),
        (lambda wf: wf.add("x", "a", max_retries=-1), "max_retries"),
        (lambda wf: wf.add("x", "a", after=["x"]), "cycle"),
    ],
)
async def test_invalid_workflows_are_refused_before_anything_is_written(
    db: asyncpg.Connection, build: Any, message: str
) -> None:
    wf = Workflow("bad")
    with pytest.raises(InvalidJob, match=message):
        build(wf)
        await submit(db, wf)
    for table in ("jobs", "job_outbox", "workflows", "job_dependencies"):
        assert await db.fetchval(f"SELECT count(*) FROM {table}") == 0


async def test_size_limits_are_enqueues(db: asyncpg.Connection, monkeypatch: Any) -> None:
    wf = Workflow("big")
    wf.add("x", "a", {"s": "x" * 300_000})
    with pytest.raises(PayloadTooLarge, match="workflow job 'x'"):
        await submit(db, wf)
    monkeypatch.setenv("CONVEYOR_MAX_WORKFLOW_JOBS", "3")
    with pytest.raises(InvalidJob, match="has 5 jobs; the limit is 3"):
        await submit(db, diamond())
    monkeypatch.delenv("CONVEYOR_MAX_WORKFLOW_JOBS")
    # the default edge bound: 991 jobs each after all of 101 others, 100,091 edges
    dense = Workflow("dense")
    firsts = [dense.add(f"p{i}", "a") for i in range(101)]
    for i in range(991):
        dense.add(f"c{i}", "a", after=firsts)
    with pytest.raises(InvalidJob, match=r"100091 dependencies; the limit is 100000 \(CONVEYOR"):
        await submit(db, dense)
    assert await db.fetchval("SELECT count(*) FROM jobs") == 0


async def test_cancel_policy_cancels_downstream_and_the_rest_goes_on(
    db: asyncpg.Connection,
) -> None:
    wf = diamond()
    wf.add("after-report", "a", after=["report"])
    wf.add("side", "a", after=["part-1"])
    wid = await submit(db, wf)
    key = await ids(db, wid)
    await complete(db, key["fetch"])
    await fail(db, key["part-0"], "bad input")
    st = await statuses(db, wid)
    assert st["report"] == st["after-report"] == "CANCELLED"
    assert st["part-1"] == st["part-2"] == "PENDING" and st["side"] == "WAITING"
    errors = dict(
        await db.fetch("SELECT workflow_key, last_error FROM jobs WHERE status = 'CANCELLED'")
    )
    cause = f"dependency part-0 (job {key['part-0']}) failed"
    assert errors == {"report": cause, "after-report": cause}
    await complete(db, key["part-1"])
    await complete(db, key["part-2"])
    await complete(db, key["side"])
    assert await workflow_status(db, wid) == "FAILED"
    # a retry brings the cancelled dependents back to WAITING and the workflow back to RUNNING
    assert await STORE.job_redrive(db, [key["part-0"]]) == [key["part-0"]]
    st = await statuses(db, wid)
    assert (st["part-0"], st["report"], st["after-report"]) == ("PENDING", "WAITING", "WAITING")
    assert await workflow_status(db, wid) == "RUNNING"
    pending = dict(await db.fetch("SELECT workflow_key, deps_pending FROM jobs "
                                  "WHERE status = 'WAITING'"))  # fmt: skip
    assert pending == {"report": 1, "after-report": 1}
    assert await outboxed(db, wid) >= {"part-0"}
    assert "report" not in await outboxed(db, wid)
    await complete(db, key["part-0"])
    await complete(db, key["report"])
    await complete(db, key["after-report"])
    assert await workflow_status(db, wid) == "COMPLETED"


async def test_continue_policy_releases_dependents_and_handlers_see_why(
    db: asyncpg.Connection,
) -> None:
    seen: dict[str, Any] = {}
    router = JobRouter()

    @router.job("c")
    async def report(job: Job) -> str:
        seen.update(parents=job.parents, statuses=job.parent_statuses, wf=job.workflow_id)
        return "ok"

    wid = await submit(db, diamond("continue"))
    key = await ids(db, wid)
    await complete(db, key["fetch"], {"rows": 2})
    await fail(db, key["part-0"])
    assert (await statuses(db, wid))["report"] == "WAITING"
    await complete(db, key["part-1"], 1)
    await STORE.job_cancel(db, key["part-2"])
    assert (await statuses(db, wid))["report"] == "PENDING"
    await drain(db, router)
    assert seen == {
        "parents": {"part-0": None, "part-1": 1, "part-2": None},
        "statuses": {"part-0": "FAILED", "part-1": "COMPLETED", "part-2": "CANCELLED"},
        "wf": wid,
    }
    assert await workflow_status(db, wid) == "FAILED"


async def test_every_claim_returns_a_workflow_jobs_parents(db: asyncpg.Connection) -> None:
    """``job.parents`` comes with each of the three claims, for all the claim's workflow jobs in
    one lookup (``claimed_parents``): the plain claim (a plain job beside them gets none), the
    completing worker's claim of the jobs its completion released, and the claim of a limited
    type's job once admitted (the completing worker's claim never sees it: it was released to
    admission)."""
    r = JobRouter()
    r.job("lim", concurrency=5)(_nothing)
    await register_router_types(db, r)
    wf = Workflow("claims")
    wf.add("root", "a")
    wf.add("next", "a", after=["root"])
    wf.add("limited", "lim", after=["root"])
    wid = await submit(db, wf)
    key = await ids(db, wid)
    [plain] = await enqueue_many(db, [JobSpec("a")])
    claimed = await STORE.job_claim_many(
        db, [key["root"], plain], lease_seconds=60, worker_id="w", types=["a"],
        handler_defaults={}, default_max_retries=0,
    )  # fmt: skip
    assert {c.id: c.parents for c in claimed} == {key["root"]: None, plain: None}
    [root] = [c for c in claimed if c.id == key["root"]]
    expected = {"root": {"status": "COMPLETED", "result": {"n": 1}}}
    async with db.transaction():
        await STORE.job_complete_many(db, [Completion(key["root"], root.attempts, '{"n": 1}')])
        followed = await STORE.job_claim_released(
            db, room=2, lease_seconds=60, worker_id="w", types=["a", "lim"],
            handler_defaults={}, default_max_retries=0,
        )  # fmt: skip
    assert [(c.id, c.parents) for c in followed] == [(key["next"], expected)]
    # the limited job waits for admission (no outbox row), then is claimed as any other
    assert await outboxed(db, wid) == {"root"}
    assert await STORE.admit(db, "lim", 10) == 1
    limited = await STORE.job_claim_many(
        db, [key["limited"]], lease_seconds=60, worker_id="w", types=["lim"],
        handler_defaults={}, default_max_retries=0,
    )  # fmt: skip
    assert [(c.id, c.parents) for c in limited] == [(key["limited"], expected)]


async def _nothing(job: Any) -> None:
    return None


async def test_handlers_see_parents_and_workflow_id(db: asyncpg.Connection) -> None:
    got: dict[str, Any] = {}
    router = JobRouter()

    @router.job("a")
    async def first(job: Job) -> Any:
        got[job.payload["k"]] = (job.workflow_id, job.parents)
        return job.payload["k"] * 2

    @router.job("b")
    async def total(job: Job) -> int:
        got["sum"] = (job.workflow_id, job.parents)
        return sum(job.parents.values())

    wf = chord(group(("a", {"k": 1}), ("a", {"k": 2})), ("b", {}))
    wid = await submit(db, wf)
    result = await drain(db, router)
    assert result.completed == 3
    assert got[1] == (wid, {}) and got[2] == (wid, {})
    assert got["sum"] == (wid, {"a": 2, "a-2": 4})
    assert await db.fetchval("SELECT result::text FROM jobs WHERE workflow_key = 'b'") == "6"
    assert await workflow_status(db, wid) == "COMPLETED"


def test_chain_group_chord_shapes() -> None:
    c = chain(("a", {}), ("b", {}), ("a", {"n": 2}, {"priority": "high"}))
    assert {k: n.after for k, n in c.nodes.items()} == {"a": (), "b": ("a",), "a-2": ("b",)}
    assert c.nodes["a-2"].spec.priority == "high"
    g = group(("a", {"i": 1}), ("a", {"i": 2}))
    assert {k: n.after for k, n in g.nodes.items()} == {"a": (), "a-2": ()}
    ch = chord(g, ("sum", {}))
    assert ch.nodes["sum"].after == ("a", "a-2")
    nested = chain(("x", {}), chord([("a", {}), ("b", {})], ("c", {})), ("t", {}))
    assert {k: n.after for k, n in nested.nodes.items()} == {
        "x": (),
        "a": ("x",),
        "b": ("x",),
        "c": ("a", "b"),
        "t": ("c",),
    }
    assert nested.order().index("c") > nested.order().index("b")


async def test_a_future_run_at_is_kept_at_release(db: asyncpg.Connection) -> None:
    wf = Workflow("later")
    wf.add("now", "a")
    wf.add("later", "a", after=["now"], run_at=datetime.now(UTC) + timedelta(hours=1))
    wf.add("soon", "a", after=["now"])
    wid = await submit(db, wf)
    key = await ids(db, wid)
    await complete(db, key["now"])
    st = await statuses(db, wid)
    assert (st["later"], st["soon"]) == ("SCHEDULED", "PENDING")
    assert await outboxed(db, wid) == {"now", "soon"}


async def test_cancel_workflow_cancels_open_jobs_and_releases_nothing_after(
    db: asyncpg.Connection,
) -> None:
    wid = await submit(db, diamond())
    key = await ids(db, wid)
    attempt = await claim(db, key["fetch"])  # running when the workflow is cancelled
    assert await cancel_workflow(db, wid) == 5
    st = await statuses(db, wid)
    assert st["fetch"] == "IN_PROGRESS" and {st[f"part-{i}"] for i in range(3)} == {"CANCELLED"}
    assert await workflow_status(db, wid) == "CANCELLED"
    await STORE.job_complete_many(db, [Completion(key["fetch"], attempt or 0, "1")])
    st = await statuses(db, wid)
    assert set(st.values()) == {"CANCELLED"}  # the running job's result was discarded
    assert await outboxed(db, wid) == {"fetch"}
    assert await workflow_status(db, wid) == "CANCELLED"
    # a job cancelled with its workflow stays cancelled when another is retried
    await STORE.job_redrive(db, [key["fetch"]])
    assert (await statuses(db, wid))["report"] == "CANCELLED"
    with pytest.raises(LookupError):
        await cancel_workflow(db, key["fetch"])


async def test_operator_sql_respects_dependencies(db: asyncpg.Connection) -> None:
    wid = await submit(db, diamond())
    key = await ids(db, wid)
    # retry_job of a WAITING job changes nothing and publishes nothing
    assert await db.fetchval("SELECT retry_job($1)", key["report"]) == "WAITING"
    assert await outboxed(db, wid) == {"fetch"}
    await complete(db, key["fetch"])
    await fail(db, key["part-0"])
    assert (await statuses(db, wid))["report"] == "CANCELLED"
    # a retry of the cancelled dependent itself, while its dependency is FAILED, leaves it as
    # it is (it comes back when the dependency is retried)
    assert await db.fetchval("SELECT retry_job($1)", key["report"]) == "CANCELLED"
    assert await STORE.job_redrive(db, [key["report"]]) == []
    assert "report" not in await outboxed(db, wid)
    # while a dependency is open, a retried dependent waits for it
    assert await STORE.job_redrive(db, [key["part-0"]]) == [key["part-0"]]
    assert (await statuses(db, wid))["report"] == "WAITING"
    # cancel_job cancels a WAITING job
    assert await db.fetchval("SELECT cancel_job($1)", key["report"]) == "CANCELLED"
    assert await db.fetchval("SELECT count(*) FROM blocked_jobs") == 0
    assert await db.fetchval("SELECT retry_job($1)", key["report"]) == "WAITING"
    assert "report" not in await outboxed(db, wid)
    blocked = await db.fetchrow("SELECT key, waiting_for FROM blocked_jobs")
    assert blocked["key"] == "report" and blocked["waiting_for"] == [
        "part-0 (PENDING)",
        "part-1 (PENDING)",
        "part-2 (PENDING)",
    ]
    running = await db.fetchrow("SELECT * FROM running_workflows")
    assert running["workflow_id"] == wid and running["waiting"] == 1


async def test_maintenance_leaves_waiting_jobs_alone(db: asyncpg.Connection) -> None:
    wid = await submit(db, diamond())
    key = await ids(db, wid)
    await db.execute(
        "UPDATE jobs SET updated_at = now() - interval '1 day', "
        "created_at = now() - interval '1 day', run_at = now() - interval '1 day'"
    )
    # with every message lost, the reconciler counts only the PENDING job as overdue; lease
    # recovery and promotion leave WAITING jobs alone
    await db.execute("DELETE FROM job_outbox")
    assert await STORE.job_count_overdue(db, after=60) == {"a": 1}
    expired = await STORE.job_expired_ids(db, limit=100, aside=[])
    assert expired == []
    await STORE.job_recover_expired(db, expired, default_max_retries=3)
    await STORE.job_promote_due(db, limit=100)
    assert list((await statuses(db, wid)).values()).count("WAITING") == 4
    # retention keeps a running workflow's jobs, however old, and deletes a finished one whole
    await complete(db, key["fetch"])
    await fail(db, key["part-0"])
    await db.execute("UPDATE jobs SET finished_at = now() - interval '30 days' "
                     "WHERE finished_at IS NOT NULL")  # fmt: skip
    assert await STORE.job_delete_expired(db, older_than=1, failed_older_than=1, limit=100) == 0
    assert await STORE.workflow_delete_expired(db, older_than=1, failed_older_than=1, limit=10) == 0
    for i in (1, 2):
        await complete(db, key[f"part-{i}"])
    assert await workflow_status(db, wid) == "FAILED"
    await db.execute("UPDATE workflows SET finished_at = now() - interval '30 days'")
    assert (
        await STORE.workflow_delete_expired(db, older_than=86400, failed_older_than=1, limit=10)
        == 1
    )
    for table in ("jobs", "workflows", "job_dependencies", "job_attempts"):
        assert await db.fetchval(f"SELECT count(*) FROM {table}") == 0


async def test_an_idle_retention_pass_reads_no_workflow_within_its_age(
    db: asyncpg.Connection,
) -> None:
    """Retention's pass over workflows finds the expired ones by the range of their finish
    times; the age depends on the status (a day for COMPLETED here, 30 for FAILED), which alone
    is no index condition, and a pass with nothing to delete read every finished workflow. Here
    2,000 finished within the shorter age: the pass reads none of them; one older than the
    longer age is deleted."""
    await db.execute(
        "INSERT INTO workflows (id, name, on_failure, status, finished_at) "
        "SELECT gen_random_uuid(), 'kept', 'cancel', "
        "       CASE WHEN g % 2 = 0 THEN 'COMPLETED' ELSE 'FAILED' END, "
        "       now() - g * interval '1 second' FROM generate_series(1, 2000) g"
    )
    await db.execute("ANALYZE workflows")

    async def read() -> int:
        # index entries returned in this transaction
        return int(
            await db.fetchval(
                "SELECT pg_stat_get_xact_tuples_returned('workflows_finished_idx'::regclass)"
            )
        )

    day, month = 86400, 30 * 86400
    async with db.transaction():
        before = await read()
        assert await STORE.workflow_delete_expired(
            db, older_than=day, failed_older_than=month, limit=500
        ) == 0  # fmt: skip
        assert await read() - before == 0
    await db.execute(
        "INSERT INTO workflows (id, name, on_failure, status, finished_at) "
        "VALUES (gen_random_uuid(), 'old', 'cancel', 'FAILED', now() - interval '31 days')"
    )
    assert (
        await STORE.workflow_delete_expired(db, older_than=day, failed_older_than=month, limit=500)
        == 1
    )
    assert await db.fetchval("SELECT count(*) FROM workflows") == 2000


async def test_a_cancelled_workflow_gets_its_finish_and_retention_deletes_it(
    db: asyncpg.Connection,
) -> None:
    """``cancel_workflow`` marks the workflow CANCELLED at once, while a job it asked to stop
    may still run; once none is open the finishing duty stamps ``finished_at``, which
    retention needs (a CANCELLED workflow without it would be kept for ever)."""
    wid = await submit(db, diamond())
    key = await ids(db, wid)
    attempt = await claim(db, key["fetch"])
    await cancel_workflow(db, wid)
    assert await STORE.workflow_finish(db, limit=10) == 0  # fetch still runs
    await STORE.job_complete_many(db, [Completion(key["fetch"], attempt or 0, "1")])
    assert await STORE.workflow_finish(db, limit=10) == 1
    row = await db.fetchrow("SELECT status, finished_at FROM workflows WHERE id = $1", wid)
    assert row["status"] == "CANCELLED" and row["finished_at"] is not None
    assert await STORE.workflow_finish(db, limit=10) == 0
    await db.execute("UPDATE workflows SET finished_at = now() - interval '2 days'")
    assert await STORE.workflow_delete_expired(db, older_than=1, failed_older_than=1, limit=10)
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE workflow_id = $1", wid) == 0


async def test_the_finish_duty_is_the_backstop_of_two_last_jobs_at_once(
    db: asyncpg.Connection,
) -> None:
    wid = await submit(db, chain(("a", {}), ("b", {})))
    key = await ids(db, wid)
    await complete(db, key["a"])
    await complete(db, key["b"])
    # as if the last two jobs had finished at once, each seeing the other open
    await db.execute("UPDATE workflows SET status = 'RUNNING', finished_at = NULL")
    assert await STORE.workflow_finish(db, limit=10) == 1
    assert await workflow_status(db, wid) == "COMPLETED"
    assert await STORE.workflow_finish(db, limit=10) == 0
    # and a workflow finished while one of its jobs was retried runs again
    await db.execute("UPDATE jobs SET status = 'PENDING' WHERE workflow_key = 'b'")
    await db.execute("UPDATE workflows SET status = 'FAILED', finished_at = now()")
    assert await STORE.workflow_reopen(db) == 1
    assert await workflow_status(db, wid) == "RUNNING"


async def test_get_workflow_and_a_workflow_job_refused_by_its_key(db: asyncpg.Connection) -> None:
    wid = await submit(db, diamond())
    got = await get_workflow(db, wid)
    assert got is not None
    row, jobs = got
    assert (row.name, row.status, row.jobs, row.waiting, row.queued) == (
        "nightly-report", "RUNNING", 5, 4, 1,
    )  # fmt: skip
    assert sorted(j.key for j in jobs) == ["fetch", "part-0", "part-1", "part-2", "report"]
    assert next(j for j in jobs if j.key == "report").after == ["part-0", "part-1", "part-2"]
    wf = Workflow("dup")
    wf.add("x", "a", unique_for=60, unique_key="once")
    await submit(db, wf)
    wf2 = Workflow("dup")
    wf2.add("y", "a", unique_for=60, unique_key="once")
    with pytest.raises(InvalidJob, match="workflow job 'y'"):
        await submit(db, wf2)
    assert await db.fetchval("SELECT count(*) FROM workflows") == 2


async def test_sqlalchemy_session_and_the_sync_variant(db: asyncpg.Connection, db_url: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import Session

    from conveyor import enqueue_sync

    engine = create_async_engine(db_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with AsyncSession(engine) as session, session.begin():
            await enqueue_workflow(session, chain(("a", {}), ("b", {})))
    finally:
        await engine.dispose()
    sync_engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(sync_engine) as s, s.begin():
            wid = enqueue_sync.enqueue_workflow(s, chain(("a", {}), ("b", {})))
        with Session(sync_engine) as s, s.begin():
            assert enqueue_sync.cancel_workflow(s, wid) == 2
    finally:
        sync_engine.dispose()
    assert await db.fetchval("SELECT count(*) FROM workflows") == 2
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE status = 'WAITING'") == 1


@pytest.fixture(autouse=True)
def _schema_env(monkeypatch: Any) -> None:
    monkeypatch.delenv("CONVEYOR_MAX_WORKFLOW_JOBS", raising=False)


async def test_both_submit_paths_keep_every_option(db: asyncpg.Connection) -> None:
    """Without unique keys a workflow is one statement (``workflow_insert``); with one, the
    usual submit then ``workflow_attach``: the same rows either way."""
    for unique in (False, True):
        wf = Workflow(f"options-{unique}")
        wf.add("a", "a", {"n": 1}, meta={"m": 1}, idempotency_key=f"idem-{unique}",
               unique_for=60 if unique else None)  # fmt: skip
        wf.add("b", "b", after=["a"], priority=2, timeout_seconds=9, max_retries=4)
        wf.add("later", "b", after=["a"], delay_seconds=3600)
        wid = await submit(db, wf)
        due = await db.fetchval(
            "SELECT run_at - now() FROM jobs WHERE workflow_id = $1 AND workflow_key = 'later'",
            wid,
        )
        assert abs(due - timedelta(hours=1)) < timedelta(minutes=1)
        rows = {r["workflow_key"]: r for r in await db.fetch(
            "SELECT workflow_key, status::text AS status, meta::text AS meta, priority,"
            " timeout_seconds, max_retries, deps_pending, idempotency_key FROM jobs"
            " WHERE workflow_id = $1", wid)}  # fmt: skip
        assert (rows["a"]["status"], rows["a"]["meta"], rows["a"]["idempotency_key"]) == (
            "PENDING", '{"m": 1}', f"idem-{unique}",
        )  # fmt: skip
        b = rows["b"]
        assert (b["status"], b["priority"], b["timeout_seconds"], b["max_retries"]) == (
            "WAITING", 2, 9.0, 4,
        )  # fmt: skip
        assert await outboxed(db, wid) == {"a"}
        key = await ids(db, wid)
        await complete(db, key["a"])
        assert [(await statuses(db, wid))[k] for k in ("b", "later")] == ["PENDING", "SCHEDULED"]
        again = Workflow("again")
        again.add("a", "a", idempotency_key=f"idem-{unique}")
        with pytest.raises(InvalidJob, match="workflow job 'a'"):
            await submit(db, again)


async def test_a_retry_brings_back_only_dependents_with_no_other_failed_dependency(
    db: asyncpg.Connection,
) -> None:
    wf = Workflow("two-failures")
    wf.add("x", "a")
    wf.add("y", "a")
    wf.add("d", "b", after=["x", "y"])
    wf.add("e", "b", after=["d"])
    wf.add("only-x", "b", after=["x"])
    wid = await submit(db, wf)
    key = await ids(db, wid)
    await fail(db, key["x"])
    await fail(db, key["y"])
    await STORE.job_redrive(db, [key["x"]])
    st = await statuses(db, wid)
    # d (and e after it) still has a failed dependency, y: it stays cancelled
    assert (st["only-x"], st["d"], st["e"]) == ("WAITING", "CANCELLED", "CANCELLED")
    await STORE.job_redrive(db, [key["y"]])
    st = await statuses(db, wid)
    assert (st["d"], st["e"]) == ("WAITING", "WAITING")
    for k in ("x", "y", "only-x", "d", "e"):
        await complete(db, key[k])
    assert await workflow_status(db, wid) == "COMPLETED"


async def _redrive(db: asyncpg.Connection, path: str, job_id: Any) -> None:
    """One redrive of a finished workflow's job, by ``path``: the API's and the CLI's
    (``job_redrive``), the dead-letter tools' (``job_redrive_failed``, at the attempt the letter
    recorded), the bulk redrive of the dead (``job_redrive_dead``), the operator's SQL
    (``retry_job``)."""
    if path == "api":
        assert await STORE.job_redrive(db, [job_id]) == [job_id]
    elif path == "dlq":
        attempt = await db.fetchval("SELECT attempts FROM jobs WHERE id = $1", job_id)
        letter = Attempt(job_id, attempt)
        assert await STORE.job_redrive_failed(db, [letter]) == [job_id]
    elif path == "dead":
        assert await STORE.job_redrive_dead(db, "a", None, limit=10) == 1
    else:
        assert await db.fetchval("SELECT retry_job($1)", job_id) in ("PENDING", "SCHEDULED")


@pytest.mark.parametrize(
    ("ending", "path"),
    [("cancel", "api"), ("cancel", "sql"), ("fail", "api"), ("fail", "dlq"), ("fail", "dead"),
     ("fail", "sql")],
)  # fmt: skip
async def test_retention_never_deletes_a_redriven_job_of_a_finished_workflow(
    db: asyncpg.Connection, ending: str, path: str
) -> None:
    """A workflow finished long ago (cancelled while its first job was still delayed, or failed),
    then one of its jobs redriven: the workflow is open again (no ``finished_at``) while that job
    runs, so retention, which deletes a finished workflow whole, keeps it and the running job;
    once the job ends the workflow finishes again and retention deletes it."""
    wf = Workflow("old", on_failure="cancel")
    first = wf.add("first", "a", {}, delay_seconds=3600, max_retries=0)
    wf.add("next", "b", {}, after=[first])
    wid = await submit(db, wf)
    key = await ids(db, wid)
    if ending == "cancel":
        await cancel_workflow(db, wid)
    else:
        await db.execute("UPDATE jobs SET run_at = now() WHERE id = $1", key["first"])
        await STORE.job_promote_due(db, limit=10)
        await fail(db, key["first"])
    await STORE.workflow_finish(db, limit=10)
    first_status = "FAILED" if ending == "fail" else "CANCELLED"
    assert await statuses(db, wid) == {"first": first_status, "next": "CANCELLED"}
    await db.execute("UPDATE workflows SET finished_at = now() - interval '40 days'")

    await _redrive(db, path, key["first"])
    assert await db.fetchval("SELECT finished_at FROM workflows WHERE id = $1", wid) is None
    await db.execute("UPDATE jobs SET run_at = now() WHERE id = $1 AND status = 'SCHEDULED'",
                     key["first"])  # fmt: skip
    await STORE.job_promote_due(db, limit=10)
    attempt = await claim(db, key["first"])
    assert attempt is not None
    for _ in range(2):  # the finishing duty and retention run meanwhile: neither touches it
        await STORE.workflow_finish(db, limit=10)
        await STORE.workflow_reopen(db)
        assert await STORE.workflow_delete_expired(
            db, older_than=1, failed_older_than=1, limit=10
        ) == 0  # fmt: skip
    assert (await statuses(db, wid))["first"] == "IN_PROGRESS"

    await STORE.job_complete_many(db, [Completion(key["first"], attempt, "1")])
    await STORE.workflow_finish(db, limit=10)
    wf_row = await db.fetchrow("SELECT status, finished_at FROM workflows WHERE id = $1", wid)
    if ending == "fail":  # the redrive brought "next" back: it runs now, the workflow with it
        assert await statuses(db, wid) == {"first": "COMPLETED", "next": "PENDING"}
        assert (wf_row["status"], wf_row["finished_at"]) == ("RUNNING", None)
        return
    # a cancelled workflow stays cancelled, its other jobs too, and finishes again
    assert await statuses(db, wid) == {"first": "COMPLETED", "next": "CANCELLED"}
    assert wf_row["status"] == "CANCELLED" and wf_row["finished_at"] is not None
    await db.execute("UPDATE workflows SET finished_at = now() - interval '40 days'")
    assert await STORE.workflow_delete_expired(
        db, older_than=1, failed_older_than=1, limit=10
    ) == 1  # fmt: skip
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE workflow_id = $1", wid) == 0
