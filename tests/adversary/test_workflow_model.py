"""Workflows, modelled with Hypothesis against the real store on a real PostgreSQL database: a
random DAG under a random policy, then random completions, failures, cancels, redrives, an
operator's hand re-runs (``UPDATE jobs SET status = 'PENDING'`` on a finished job, with an outbox
row) and workflow cancels, some of them concurrently on two connections (two workers finishing
parents of one child at once, a redrive racing a workflow cancel, a hand re-run racing a
completion). After each step a simulated relay takes the outbox rows; then every open job is
driven to its end. Checked (from the audit trail of every status change,
``tests/faults/checker.py``):

- a job is released (WAITING -> PENDING/SCHEDULED) at most once per time it went WAITING, and
  only when each of its dependencies was COMPLETED (``continue``: finished) at that point;
- no job is claimed (-> IN_PROGRESS) while a dependency it needs is unfinished;
- no outbox row (no message) for a WAITING job; ``deps_pending`` of a WAITING job counts its
  unmet dependencies;
- while a job of the workflow is open the workflow is not finished (``finished_at`` NULL, which
  retention goes by), after the reopening duty's step that a reopen racing the workflow's finish
  needs; once every job is final, the workflow is final (after the finishing duty's
  one step) with the status its jobs give it, and no job is left WAITING (no release lost).

``make test`` runs a bounded search; ``-m soak`` a long one (``WORKFLOW_EXAMPLES``)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import Workflow, enqueue_workflow
from conveyor.store import Completion, Failure, for_schema
from conveyor.store.connect import with_database

from ..conftest import RUN_ID
from ..db import SCHEMA
from ..faults.checker import install_audit
from ..services import Endpoints

STORE = for_schema()
FINAL = {"COMPLETED", "FAILED", "CANCELLED"}
OPEN = {"WAITING", "PENDING", "SCHEDULED", "IN_PROGRESS", "RETRYING"}


@pytest.fixture(scope="module")
def model_db(
    endpoints: Endpoints, template_db: str
) -> Iterator[tuple[asyncio.AbstractEventLoop, asyncpg.Pool]]:
    loop = asyncio.new_event_loop()
    name = f"conveyor_wfmodel_{RUN_ID}"
    url = with_database(endpoints.database_url, name)

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(endpoints.database_url, timeout=5)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def setup() -> asyncpg.Pool:
        await admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        await install_audit(url)
        return await asyncpg.create_pool(
            url, min_size=2, max_size=3, server_settings={"search_path": f"{SCHEMA}, public"}
        )

    pool = loop.run_until_complete(setup())
    try:
        yield loop, pool
    finally:
        loop.run_until_complete(pool.close())
        loop.run_until_complete(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        loop.close()


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[list[int]], str]:
    """Parents of each job, by index (only earlier jobs: a DAG), and the policy."""
    n = draw(st.integers(2, 9))
    parents = [
        sorted(draw(st.sets(st.integers(0, i - 1), max_size=min(i, 4)))) if i else []
        for i in range(n)
    ]
    return parents, draw(st.sampled_from(["cancel", "continue"]))


OPS = [
    "complete",
    "fail",
    "cancel",
    "retry",
    "rerun",
    "pair",
    "pair_fail",
    "rerun_vs_complete",
    "cancel_wf",
    "retry_vs_cancel",
]
steps = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 8), st.integers(0, 8)), max_size=14)


async def _claim(conn: Any, job_id: uuid.UUID) -> int | None:
    rows = await STORE.job_claim_many(
        conn, [job_id], lease_seconds=60, worker_id="m", types=["a"], handler_defaults={},
        default_max_retries=0,
    )  # fmt: skip
    return rows[0].attempts if rows else None


async def _finish(pool: asyncpg.Pool, job_id: uuid.UUID, ok: bool) -> None:
    """Claim and finish one job in a transaction of its own (a worker's claim, then its batch)."""
    async with pool.acquire() as conn:
        attempt = await _claim(conn, job_id)
        if attempt is None:
            return
        for _ in range(3):  # a deadlock victim retries, as the worker's completer does
            try:
                async with conn.transaction():
                    if ok:
                        await STORE.job_complete_many(conn, [Completion(job_id, attempt, "1")])
                    else:
                        await STORE.job_fail_many(conn, [Failure(job_id, attempt, "x", None)])
                return
            except asyncpg.DeadlockDetectedError:
                continue
        raise AssertionError("three deadlocks in a row")


async def _rerun(conn: Any, job_id: uuid.UUID) -> None:
    """An operator runs a finished job again by hand, as the operator SQL's docs allow: back to
    PENDING, and an outbox row only when it stayed PENDING (a trigger may keep it WAITING)."""
    async with conn.transaction():
        status = await conn.fetchval(
            "UPDATE jobs SET status = 'PENDING', result = NULL, finished_at = NULL, "
            "cancel_requested = false, retry_count = 0, updated_at = now() "
            "WHERE id = $1 AND status IN ('COMPLETED', 'FAILED', 'CANCELLED') "
            "RETURNING status::text",
            job_id,
        )
        if status == "PENDING":
            await conn.execute(
                "INSERT INTO job_outbox (job_id, job_type, priority) VALUES ($1, 'a', 5)", job_id
            )


async def _with(pool: asyncpg.Pool, fn: Any) -> Any:
    """An operator's or the API's call: tried again when it is a deadlock's victim."""
    for _ in range(3):
        try:
            async with pool.acquire() as conn:
                return await fn(conn)
        except asyncpg.DeadlockDetectedError:
            continue
    raise AssertionError("three deadlocks in a row")


async def _step(pool: asyncpg.Pool, op: str, a: uuid.UUID, b: uuid.UUID, wid: uuid.UUID) -> None:
    if op == "complete":
        await _finish(pool, a, True)
    elif op == "fail":
        await _finish(pool, a, False)
    elif op == "cancel":
        await _with(pool, lambda c: STORE.job_cancel(c, a))
    elif op == "retry":
        await _with(pool, lambda c: STORE.job_redrive(c, [a]))
    elif op == "rerun":
        await _with(pool, lambda c: _rerun(c, a))
    elif op == "rerun_vs_complete":
        await asyncio.gather(_with(pool, lambda c: _rerun(c, a)), _finish(pool, b, True))
    elif op in ("pair", "pair_fail"):
        await asyncio.gather(_finish(pool, a, True), _finish(pool, b, op == "pair"))
    elif op == "cancel_wf":
        await asyncio.gather(
            _with(pool, lambda c: STORE.workflow_cancel(c, wid)), _finish(pool, a, True)
        )
    else:
        await asyncio.gather(
            _with(pool, lambda c: STORE.job_redrive(c, [a])),
            _with(pool, lambda c: STORE.workflow_cancel(c, wid)),
        )


async def _relay_and_check(pool: asyncpg.Pool, wid: uuid.UUID, policy: str) -> None:
    """The simulated relay takes every outbox row: none may belong to a WAITING job. And each
    WAITING job's counter is its unmet dependencies."""
    async with pool.acquire() as conn, conn.transaction():
        taken = await conn.fetch(
            "DELETE FROM job_outbox o USING jobs j WHERE j.id = o.job_id AND j.workflow_id = $1 "
            "RETURNING j.workflow_key, j.status::text AS status",
            wid,
        )
        assert all(r["status"] != "WAITING" for r in taken), taken
        unmet = "p.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')" if policy == "continue" \
            else "p.status <> 'COMPLETED'"  # fmt: skip
        wrong = await conn.fetch(
            f"""SELECT j.workflow_key, j.deps_pending,
                       (SELECT count(*) FROM job_dependencies d JOIN jobs p ON p.id = d.depends_on
                        WHERE d.job_id = j.id AND {unmet}) AS unmet
                FROM jobs j WHERE j.workflow_id = $1 AND j.status = 'WAITING'""",
            wid,
        )
        assert all(r["deps_pending"] == r["unmet"] for r in wrong), wrong
        open_jobs = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE workflow_id = $1 AND status IN "
            "('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING')",
            wid,
        )
        # a job reopened while another transaction finished the workflow (each saw the other's
        # change uncommitted): the finishing duty's backstop reopens it, as the sweeper does
        await STORE.workflow_reopen(conn)
        finished = await conn.fetchval("SELECT finished_at FROM workflows WHERE id = $1", wid)
        assert not (open_jobs and finished), f"finished at {finished} with {open_jobs} open jobs"


async def _drive_to_end(pool: asyncpg.Pool, wid: uuid.UUID) -> None:
    for _ in range(50):
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT id, status::text AS status FROM jobs WHERE workflow_id = $1", wid
            )
        runnable = [r["id"] for r in rows if r["status"] in ("PENDING", "RETRYING")]
        running = [r["id"] for r in rows if r["status"] == "IN_PROGRESS"]
        if not runnable and not running:
            return
        for job_id in running:  # a claim the model left hanging: its attempt ends now
            async with pool.acquire() as conn:
                attempt = await conn.fetchval("SELECT attempts FROM jobs WHERE id = $1", job_id)
                await STORE.job_complete_many(conn, [Completion(job_id, attempt, "1")])
        await asyncio.gather(*(_finish(pool, j, True) for j in runnable))
    raise AssertionError("the workflow did not settle in 50 rounds")


async def _check_history(pool: asyncpg.Pool, wid: uuid.UUID, policy: str) -> None:
    async with pool.acquire() as conn:
        jobs = {r["id"]: r for r in await conn.fetch(
            "SELECT id, workflow_key, status::text AS status FROM jobs WHERE workflow_id = $1",
            wid,
        )}  # fmt: skip
        parents: dict[uuid.UUID, list[uuid.UUID]] = {j: [] for j in jobs}
        for r in await conn.fetch(
            "SELECT job_id, depends_on FROM job_dependencies WHERE job_id = ANY($1)", list(jobs)
        ):
            parents[r["job_id"]].append(r["depends_on"])
        audit = await conn.fetch(
            "SELECT seq, job_id, old_status, new_status FROM public.fault_audit "
            "WHERE job_id = ANY($1) ORDER BY seq",
            list(jobs),
        )
        status: dict[uuid.UUID, str] = {}
        entered: dict[uuid.UUID, int] = dict.fromkeys(jobs, 0)
        released: dict[uuid.UUID, int] = dict.fromkeys(jobs, 0)
        for a in audit:
            job, old, new = a["job_id"], a["old_status"], a["new_status"]
            if new == "WAITING" and old != "WAITING":
                entered[job] += 1
            if new == "IN_PROGRESS" and old != "IN_PROGRESS":
                ok = FINAL if policy == "continue" else {"COMPLETED"}
                at_claim = {jobs[p]["workflow_key"]: status.get(p) for p in parents[job]}
                assert all(s in ok for s in at_claim.values()), (
                    f"{jobs[job]['workflow_key']} claimed while its dependencies were {at_claim}"
                )
            if old == "WAITING" and new in ("PENDING", "SCHEDULED"):
                released[job] += 1
                assert released[job] <= entered[job], (jobs[job]["workflow_key"], "twice")
                ok = FINAL if policy == "continue" else {"COMPLETED"}
                at_release = {jobs[p]["workflow_key"]: status.get(p) for p in parents[job]}
                assert all(s in ok for s in at_release.values()), (
                    f"{jobs[job]['workflow_key']} released while its dependencies were {at_release}"
                )
            status[job] = new
        assert all(r["status"] in FINAL for r in jobs.values()), dict(
            (r["workflow_key"], r["status"]) for r in jobs.values()
        )
        await STORE.workflow_finish(conn, limit=100)
        wf = await conn.fetchrow("SELECT status, cancel_requested FROM workflows WHERE id=$1", wid)
        finals = {r["status"] for r in jobs.values()}
        expected = ("CANCELLED" if wf["cancel_requested"] else "FAILED" if "FAILED" in finals
                    else "CANCELLED" if "CANCELLED" in finals else "COMPLETED")  # fmt: skip
        assert wf["status"] == expected, (wf["status"], expected, finals)


async def _run(pool: asyncpg.Pool, dag: tuple[list[list[int]], str], ops: list[Any]) -> None:
    parents, policy = dag
    wf = Workflow("model", on_failure=policy)
    for i, ps in enumerate(parents):
        wf.add(f"j{i}", "a", {"i": i}, after=[f"j{p}" for p in ps])
    async with pool.acquire() as conn, conn.transaction():
        wid = await enqueue_workflow(conn, wf)
    async with pool.acquire() as conn:
        ids = dict(await conn.fetch(
            "SELECT workflow_key, id FROM jobs WHERE workflow_id = $1", wid
        ))  # fmt: skip
    key = [ids[f"j{i}"] for i in range(len(parents))]
    await _relay_and_check(pool, wid, policy)
    for op, a, b in ops:
        await _step(pool, op, key[a % len(key)], key[b % len(key)], wid)
        await _relay_and_check(pool, wid, policy)
    await _drive_to_end(pool, wid)
    await _check_history(pool, wid, policy)


def _search(model_db: tuple[asyncio.AbstractEventLoop, asyncpg.Pool], examples: int) -> None:
    loop, pool = model_db

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(dag=dags(), ops=steps)
    def check(dag: tuple[list[list[int]], str], ops: list[Any]) -> None:
        try:
            loop.run_until_complete(_run(pool, dag, ops))
        except AssertionError as exc:  # the example with the failure (explain blanks it)
            raise AssertionError(f"{exc}\n  dag={dag}\n  ops={ops}") from None

    check()


@pytest.mark.timeout(120)
def test_workflow_model(model_db: tuple[asyncio.AbstractEventLoop, asyncpg.Pool]) -> None:
    _search(model_db, 40)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_workflow_model_soak(model_db: tuple[asyncio.AbstractEventLoop, asyncpg.Pool]) -> None:
    _search(model_db, int(os.environ.get("WORKFLOW_EXAMPLES", "2000")))
