"""The job state machine, modelled with Hypothesis against the real store on a real PostgreSQL
database (one per run, truncated between examples). See ``state_model.py`` for the rules and the
invariants. ``make test`` runs a bounded, derandomised search; ``-m soak`` a long random one
(``MODEL_EXAMPLES``, ``MODEL_STEPS``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import asyncpg
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from conveyor.core.config import Settings
from conveyor.core.jobs import TRANSITIONS, Status
from conveyor.store.connect import with_database
from conveyor.worker import outcomes

from ..conftest import RUN_ID
from ..db import SCHEMA
from ..services import Endpoints
from .state_model import Context, machine
from .storeops import StoreOps


@pytest.fixture(scope="module")
def store_ops(
    endpoints: Endpoints, template_db: str
) -> Iterator[tuple[asyncio.AbstractEventLoop, StoreOps]]:
    loop = asyncio.new_event_loop()
    name = f"conveyor_model_{RUN_ID}"
    url = with_database(endpoints.database_url, name)

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(endpoints.database_url, timeout=5)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def setup() -> StoreOps:
        await admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        pool = await asyncpg.create_pool(
            url, min_size=1, max_size=2, server_settings={"search_path": f"{SCHEMA}, public"}
        )
        ops = StoreOps(pool, Settings(database_url=url, reconcile_after=60, default_max_retries=3))
        await ops.install()
        return ops

    async def teardown(ops: StoreOps | None) -> None:
        if ops is not None:
            await ops.pool.close()
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    ops = None
    try:
        ops = loop.run_until_complete(setup())
        yield loop, ops
    finally:
        loop.run_until_complete(teardown(ops))
        loop.close()


def _run(
    store_ops: tuple[asyncio.AbstractEventLoop, StoreOps],
    *,
    examples: int,
    steps: int,
    check_retry_bound: bool,
    derandomize: bool = True,
    shrink: bool = False,
) -> None:
    loop, ops = store_ops
    ctx = Context(loop, ops, check_retry_bound=check_retry_bound)
    run_state_machine_as_test(
        machine(ctx),
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=derandomize,
            database=None,
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
            phases=list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate],
        ),
    )


@pytest.mark.timeout(120)
def test_job_state_machine(store_ops: tuple[asyncio.AbstractEventLoop, StoreOps]) -> None:
    """Every invariant but ``retry_count <= max_retries`` (see the next test). A random search
    each run, not shrunk (a failure prints the steps and the seed; the soak shrinks): a fixed
    search found fewer seeded bugs."""
    _run(store_ops, examples=40, steps=30, check_retry_bound=False, derandomize=False)


@pytest.mark.timeout(120)
def test_retry_count_never_exceeds_max_retries(
    store_ops: tuple[asyncio.AbstractEventLoop, StoreOps],
) -> None:
    _run(store_ops, examples=20, steps=30, check_retry_bound=True)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_job_state_machine_soak(store_ops: tuple[asyncio.AbstractEventLoop, StoreOps]) -> None:
    _run(
        store_ops,
        examples=int(os.environ.get("MODEL_EXAMPLES", "1000")),
        steps=int(os.environ.get("MODEL_STEPS", "60")),
        check_retry_bound=True,
        derandomize=False,
        shrink=True,
    )


# Found by the model (failing case: claim, fail with a retry, cancel, redrive): the store's redrive
# puts a cancelled job whose run_at is still ahead back to SCHEDULED, an edge TRANSITIONS lacks;
# for a cancelled RETRYING job that run_at is its old retry time, so the redriven job waits for a
# stale backoff instead of running now.


async def _cancelled_then_redriven(ops: StoreOps, *, scheduled: bool) -> str:
    await ops.reset()
    job_id = await ops.submit(max_retries=2, delay=3600.0 if scheduled else None)
    if not scheduled:
        [claim] = await ops.claim([job_id], "w")
        failure = outcomes.failure("boom", retry_count=0, max_retries=2, spec=None)
        assert failure.delay and await ops.fail(claim, failure)
    assert await ops.cancel(job_id) and await ops.redrive(job_id)
    jobs, _ = await ops.snapshot()
    return jobs[job_id].status


# A redriven cancelled scheduled job is SCHEDULED again: that edge must be in TRANSITIONS (found by
# the state model).
def test_every_redrive_edge_is_in_transitions(
    store_ops: tuple[asyncio.AbstractEventLoop, StoreOps],
) -> None:
    loop, ops = store_ops
    status = loop.run_until_complete(_cancelled_then_redriven(ops, scheduled=True))
    assert Status(status) in TRANSITIONS[Status.CANCELLED], status


# Found by the state model: a redriven cancelled RETRYING job waited out its stale backoff.
def test_a_redriven_retrying_job_runs_now(
    store_ops: tuple[asyncio.AbstractEventLoop, StoreOps],
) -> None:
    loop, ops = store_ops
    assert loop.run_until_complete(_cancelled_then_redriven(ops, scheduled=False)) == "PENDING"
