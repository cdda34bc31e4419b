"""A workflow of the largest size allowed (``DEFAULT_MAX_JOBS``, 10,000 jobs: a root, its fan-out
and a fan-in) submitted, read and cancelled on a table whose statistics have never seen it:
each step within bounds generous for a loaded machine, and the cancel complete (every job
cancelled, nothing released after, not even by the root's completion); and the root's completion
releasing its 9,998 dependents within the same bound; a 10,000-deep chain's root failing for
good cancelling every link, and its redrive bringing them all back, each within it."""

from __future__ import annotations

import time

import asyncpg
import pytest

from conveyor import Workflow, cancel_workflow, chain, enqueue_workflow
from conveyor.store import Completion
from conveyor.workflows import DEFAULT_MAX_JOBS, get_workflow

from .workflow_steps import STORE, claim, fail

BOUND = 3.0  # seconds, for each of read and cancel: a scan of jobs per job would outlast it
# the submit validates and encodes 10,000 jobs in this process (CPU): its bound leaves room for
# a loaded machine
SUBMIT_BOUND = 8.0
CASCADE_BOUND = 5.0  # seconds, for a 10,000-deep chain's failure and for its redrive


@pytest.mark.timeout(120)
async def test_a_ten_thousand_job_workflow_is_submitted_read_and_cancelled_in_seconds(
    db: asyncpg.Connection,
) -> None:
    wf = Workflow("wide")
    root = wf.add("root", "a")
    leaves = [wf.add(f"leaf-{i}", "b", after=[root]) for i in range(DEFAULT_MAX_JOBS - 2)]
    wf.add("sink", "c", after=leaves)
    took: dict[str, float] = {}

    t = time.perf_counter()
    async with db.transaction():
        wid = await enqueue_workflow(db, wf)
    took["submit"] = time.perf_counter() - t

    t = time.perf_counter()
    got = await get_workflow(db, wid)
    took["get"] = time.perf_counter() - t
    assert got is not None
    row, jobs = got
    assert (row.jobs, row.waiting, row.queued) == (DEFAULT_MAX_JOBS, DEFAULT_MAX_JOBS - 1, 1)
    sink = next(j for j in jobs if j.key == "sink")
    assert len(jobs) == DEFAULT_MAX_JOBS and len(sink.after) == DEFAULT_MAX_JOBS - 2

    t = time.perf_counter()
    assert await cancel_workflow(db, wid) == DEFAULT_MAX_JOBS
    took["cancel"] = time.perf_counter() - t
    print(took)

    counts = await db.fetch(
        "SELECT status::text, count(*) FROM jobs WHERE workflow_id = $1 GROUP BY 1", wid
    )
    assert dict(counts) == {"CANCELLED": DEFAULT_MAX_JOBS}
    # the root's message (sent before the cancel) is dropped by the worker: nothing is claimed,
    # and no dependent has an outbox row
    root_id = next(j.id for j in jobs if j.key == "root")
    assert not await STORE.job_claim_many(
        db, [root_id], lease_seconds=60, worker_id="w", types=["a"], handler_defaults={},
        default_max_retries=0,
    )  # fmt: skip
    assert (
        await db.fetchval(
            "SELECT count(*) FROM job_outbox o JOIN jobs j ON j.id = o.job_id"
            " WHERE j.workflow_id = $1 AND j.id <> $2",
            wid,
            root_id,
        )
        == 0
    )
    assert await db.fetchval("SELECT status FROM workflows WHERE id = $1", wid) == "CANCELLED"
    assert took.pop("submit") < SUBMIT_BOUND, took
    assert all(v < BOUND for v in took.values()), took


@pytest.mark.timeout(120)
async def test_the_root_of_a_ten_thousand_job_fan_out_releases_its_dependents_in_seconds(
    db: asyncpg.Connection,
) -> None:
    """The root's completion counts its 9,998 dependents down and releases them in one
    statement: by id, each child once, whatever the statistics say of WAITING jobs (an ANALYZE
    that saw none planned a scan of ``jobs`` joined to the counts once per jobs row: 10,000 x
    10,000 rows, minutes)."""
    # a table with a history, analyzed while no job was WAITING (a deployment's usual state)
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload)"
        " SELECT gen_random_uuid(), 'old', 'COMPLETED', 5, '{}' FROM generate_series(1, 20000)"
    )
    await db.execute("ANALYZE jobs")
    wf = Workflow("wide")
    root = wf.add("root", "a")
    leaves = [wf.add(f"leaf-{i}", "b", after=[root]) for i in range(DEFAULT_MAX_JOBS - 2)]
    wf.add("sink", "c", after=leaves)
    async with db.transaction():
        wid = await enqueue_workflow(db, wf)
    root_id = await db.fetchval(
        "SELECT id FROM jobs WHERE workflow_id = $1 AND workflow_key = 'root'", wid
    )
    attempt = await claim(db, root_id)
    assert attempt is not None

    t = time.perf_counter()
    async with db.transaction():
        done = await STORE.job_complete_many(db, [Completion(root_id, attempt, "null")])
    took = time.perf_counter() - t

    assert done == {root_id}
    counts = await db.fetch(
        "SELECT status::text, count(*) FROM jobs WHERE workflow_id = $1 GROUP BY 1", wid
    )
    assert dict(counts) == {"COMPLETED": 1, "PENDING": DEFAULT_MAX_JOBS - 2, "WAITING": 1}
    assert await db.fetchval(
        "SELECT count(*) FROM job_outbox o JOIN jobs j ON j.id = o.job_id"
        " WHERE j.workflow_id = $1 AND j.id <> $2", wid, root_id
    ) == DEFAULT_MAX_JOBS - 2  # fmt: skip
    assert await db.fetchval(
        "SELECT deps_pending FROM jobs WHERE workflow_id = $1 AND workflow_key = 'sink'", wid
    ) == DEFAULT_MAX_JOBS - 2  # fmt: skip
    assert took < BOUND, took


@pytest.mark.timeout(180)
async def test_a_ten_thousand_deep_chain_fails_and_is_redriven_in_seconds(
    db: asyncpg.Connection,
) -> None:
    """A cascade walks the chain once: each link's cancel does not walk what is below it again
    (a 1,000-deep chain took 75 s that way), and each step of the walk looks up only the edges
    of the last step's jobs (a join reading every edge per step took 8.7 s for 10,000)."""
    links = chain(*[("a", {"i": i}, {"max_retries": 0}) for i in range(DEFAULT_MAX_JOBS)])
    async with db.transaction():
        wid = await enqueue_workflow(db, links)
    root_id = await db.fetchval(
        "SELECT id FROM jobs WHERE workflow_id = $1 AND deps_pending = 0", wid
    )
    await db.execute("SET statement_timeout = '60s'")  # a cubic cascade fails, not hangs
    took: dict[str, float] = {}

    t = time.perf_counter()
    await fail(db, root_id)
    took["fail"] = time.perf_counter() - t
    counts = await db.fetch(
        "SELECT status::text, count(*) FROM jobs WHERE workflow_id = $1 GROUP BY 1", wid
    )
    assert dict(counts) == {"FAILED": 1, "CANCELLED": DEFAULT_MAX_JOBS - 1}
    assert await db.fetchval("SELECT status FROM workflows WHERE id = $1", wid) == "FAILED"

    t = time.perf_counter()
    await STORE.job_redrive(db, [root_id])
    took["redrive"] = time.perf_counter() - t
    counts = await db.fetch(
        "SELECT status::text, deps_pending, count(*) FROM jobs WHERE workflow_id = $1"
        " GROUP BY 1, 2", wid
    )  # fmt: skip
    assert sorted(map(tuple, counts)) == [("PENDING", 0, 1), ("WAITING", 1, DEFAULT_MAX_JOBS - 1)]
    assert await db.fetchval("SELECT status FROM workflows WHERE id = $1", wid) == "RUNNING"
    assert all(v < CASCADE_BOUND for v in took.values()), took
