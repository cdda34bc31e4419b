"""A workflow finishes in the statement that ends its last open job, never before, with the
status its jobs give it, under either policy: checked after every statement (no finishing duty
run in between, which would hide a finish the triggers missed). Two workflows run side by side,
their jobs claimed and finished together, so one statement ends the last job of one workflow
while it completes, fails or cancels jobs of the other that release, count down or cancel
dependents."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import asyncpg
import pytest

from conveyor import Workflow, chain, enqueue_workflow
from conveyor.store import Completion, Failure

from .workflow_steps import STORE, TYPES

OPEN = {"WAITING", "PENDING", "SCHEDULED", "IN_PROGRESS", "RETRYING"}

# root -> a, b -> join, and side on its own; what each job does when it can
ROOT = ("ok", "fail", "cancel")
MIDDLE = (("ok", "ok"), ("fail", "ok"), ("ok", "cancel"), ("fail", "cancel"))
LAST = ("ok", "fail")


def diamond(policy: str) -> Workflow:
    wf = Workflow("finish", on_failure=policy)
    root = wf.add("root", "a")
    a, b = wf.add("a", "a", after=[root]), wf.add("b", "a", after=[root])
    wf.add("join", "a", after=[a, b])
    wf.add("side", "a")
    return wf


async def check(db: asyncpg.Connection, workflows: list[uuid.UUID], step: str) -> None:
    for wid in workflows:
        jobs = {
            r["workflow_key"]: r["status"]
            for r in await db.fetch(
                "SELECT workflow_key, status::text FROM jobs WHERE workflow_id = $1", wid
            )
        }
        wf = await db.fetchrow("SELECT status, finished_at FROM workflows WHERE id = $1", wid)
        finals = set(jobs.values())
        if finals & OPEN:
            expected = "RUNNING"
        elif "FAILED" in finals:
            expected = "FAILED"
        elif "CANCELLED" in finals:
            expected = "CANCELLED"
        else:
            expected = "COMPLETED"
        assert (wf["status"], wf["finished_at"] is not None) == (expected, expected != "RUNNING"), (
            step,
            jobs,
        )


async def run(db: asyncpg.Connection, policy: str, plan: dict[str, str], links: int) -> int:
    """Both workflows to their end, a statement at a time; returns the statements run."""
    async with db.transaction():
        main = await enqueue_workflow(db, diamond(policy))
        other = await enqueue_workflow(db, chain(*[("a", {})] * links, on_failure=policy))
    workflows = [main, other]
    steps = 0
    while True:
        rows = await db.fetch(
            "SELECT id, workflow_id, workflow_key, status::text FROM jobs"
            " WHERE workflow_id = ANY($1::uuid[])",
            workflows,
        )
        todo = {r["id"]: plan.get(r["workflow_key"], "ok") if r["workflow_id"] == main else "ok"
                for r in rows if r["status"] in OPEN}  # fmt: skip
        if not todo:
            return steps
        runnable = [r["id"] for r in rows if r["status"] == "PENDING"]
        cancels = [j for j, what in todo.items() if what == "cancel"]
        for job_id in cancels:  # each by the operator's function, while it waits or is queued
            await db.execute("SELECT cancel_job($1)", job_id)
            await check(db, workflows, f"cancel {job_id}")
            steps += 1
        runnable = [j for j in runnable if j not in cancels]
        if not runnable:
            assert cancels, f"no job can run: {rows}"
            continue
        claimed = await STORE.job_claim_many(
            db, runnable, lease_seconds=60, worker_id="w", types=TYPES, handler_defaults={},
            default_max_retries=0,
        )  # fmt: skip
        await check(db, workflows, "claim")
        done = [Completion(j.id, j.attempts, "1") for j in claimed if todo[j.id] == "ok"]
        failed = [Failure(j.id, j.attempts, "x", None) for j in claimed if todo[j.id] == "fail"]
        if done:
            await STORE.job_complete_many(db, done)
            await check(db, workflows, f"complete {done}")
        if failed:
            await STORE.job_fail_many(db, failed)
            await check(db, workflows, f"fail {failed}")
        steps += bool(done) + bool(failed)


@pytest.mark.parametrize("policy", ["cancel", "continue"])
async def test_a_workflow_finishes_with_its_last_job_and_the_status_of_its_jobs(
    db: asyncpg.Connection, policy: str
) -> None:
    statements = 0
    cases: list[Any] = list(itertools.product(ROOT, MIDDLE, LAST, LAST))
    for i, (root, (a, b), join, side) in enumerate(cases):
        plan = {"root": root, "a": a, "b": b, "join": join, "side": side}
        # the other workflow's last job ends beside root and side, a and b, or join
        statements += await run(db, policy, plan, links=i % 3 + 1)
    assert statements > len(cases) * 3
