"""A job whose handler kills its worker (``suicide``: ``os._exit(1)``, max_retries=1), step by
step: real ``conveyor worker`` processes, the real relay, RabbitMQ and PostgreSQL; the sweeper's
one-step methods stand in for its loop and time passes on the database's clock (no sleeping).

Under a parallel load, ``test_handler_that_kills_its_worker_ends_failed`` can see a job RETRYING
with attempts=1 after 5 worker deaths of 6. Where can the retry of such a job go?

- The delivery a dying worker holds was never acknowledged (acks follow the outcome's commit;
  early acks only after a claim, for jobs running past ``early_ack_after``): the broker requeues
  it. The retry itself leaves the sweeper's transaction as an outbox row, goes to a pen whose TTL
  is at least the ``run_at`` it was given, and comes back to the work queue: the claim's fence
  (RETRYING and due) cannot refuse it on one clock. So in that test nothing is lost: the job's
  messages wait in the work queue until a worker is up again. Its critical path is five worker
  restarts in a row (each attempt kills the only worker), and a restart takes seconds on a
  loaded machine: a fixed 60 s settle can end while the fifth is still starting, with the last
  job RETRYING, attempts=1, its messages ready.
  ``test_a_retry_waiting_for_a_worker_is_left_alone`` is that state.
- If the messages are lost anyway (a purged queue, a lost node, a consumer that acknowledged and
  died), the job is RETRYING with no message and no outbox row: the reconciler's. It counts
  RETRYING jobs as well as PENDING ones, and re-publishes by its second consecutive pass once the
  job is due longer than ``reconcile_after``. ``test_a_lost_retry_is_republished`` shows it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import orjson
import pytest

from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper

from .. import db as tdb
from .checker import Ledger
from .harness import Stack, drain, purge, queue_ready, running, topology, wait_until, worker_proc


@pytest.fixture
async def sweeper(fsettings: Settings) -> AsyncIterator[Sweeper]:
    s = Sweeper(fsettings)  # stepped by the test; the stack runs none of its own
    await s.start()
    yield s
    await s.close()


async def _row(db: asyncpg.Connection, job_id: str) -> asyncpg.Record:
    row = await db.fetchrow(
        "SELECT status::text AS status, attempts, retry_count, last_error,"
        " EXISTS (SELECT 1 FROM job_outbox o WHERE o.job_id = j.id) AS outbox"
        " FROM jobs j WHERE id = $1",
        uuid.UUID(job_id),
    )
    assert row is not None
    return row


async def _attempt_kills_its_worker(
    settings: Settings, stack: Stack, tmp_path: Path, name: str, expected_ready: int
) -> None:
    """A worker of its own runs one attempt, which kills it; the delivery it held is requeued."""
    w = worker_proc(settings, tmp_path, name, concurrency=1, types=["suicide"]).start()
    assert await w.wait(60) == 1, f"{name} did not die of its attempt:\n{w.log()[-2000:]}"
    work_q = topology(settings).work_queue("suicide")

    async def requeued() -> bool:
        return await queue_ready(settings.amqp_url, work_q) == expected_ready

    await wait_until(requeued, timeout=10, what=f"{expected_ready} ready after {name}'s death")


async def _lease_runs_out(db: asyncpg.Connection, sweeper: Sweeper) -> dict[str, int]:
    await db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 s'")
    return {str(k): v for k, v in (await sweeper.recover_leases()).items()}


async def _age(db: asyncpg.Connection, seconds: float) -> None:
    """``seconds`` pass for the reconciler (database clock)."""
    await db.execute(
        "UPDATE jobs SET updated_at = updated_at - make_interval(secs => $1),"
        " run_at = run_at - make_interval(secs => $1)",
        seconds,
    )


async def _first_attempt(
    settings: Settings, stack: Stack, tmp_path: Path, ledger: Ledger, sweeper: Sweeper
) -> tuple[str, asyncpg.Connection]:
    """Attempt 1 kills its worker; the lease runs out; the retry comes back from its pen. Left:
    RETRYING, attempts=1, two messages ready (the dead worker's requeued delivery and the
    retry), no worker up."""
    db = await tdb.connect(settings.database_url)
    job_id = await stack.submit("suicide", {"ledger": str(ledger)})
    await _attempt_kills_its_worker(settings, stack, tmp_path, "w1", expected_ready=1)
    assert await _lease_runs_out(db, sweeper) == {"RETRYING": 1}
    # the relay sends the retry to its pen (1-2 s), which dead-letters it to the work queue
    await _attempt_ready(settings, 2)
    row = await _row(db, job_id)
    assert (row["status"], row["attempts"], row["retry_count"]) == ("RETRYING", 1, 1), dict(row)
    return job_id, db


async def _attempt_ready(settings: Settings, n: int) -> None:
    work_q = topology(settings).work_queue("suicide")

    async def ready() -> bool:
        return await queue_ready(settings.amqp_url, work_q) == n

    await wait_until(ready, timeout=15, what=f"{n} messages ready in the work queue")


async def _second_attempt_fails_the_job(
    settings: Settings,
    stack: Stack,
    tmp_path: Path,
    ledger: Ledger,
    sweeper: Sweeper,
    db: asyncpg.Connection,
    job_id: str,
    ready_after: int,
) -> None:
    """A new worker takes a message, runs attempt 2 (which kills it); its lease runs out and the
    job is FAILED, out of retries, and dead-lettered."""
    await _attempt_kills_its_worker(settings, stack, tmp_path, "w2", expected_ready=ready_after)
    assert await _lease_runs_out(db, sweeper) == {"FAILED": 1}
    row = await _row(db, job_id)
    assert (row["status"], row["attempts"]) == ("FAILED", 2), dict(row)
    assert "lease expired: worker" in row["last_error"], row["last_error"]
    assert ledger.count("start") == 2
    dlq = topology(settings).dead_letter_queue

    async def dead_lettered() -> bool:
        return await queue_ready(settings.amqp_url, dlq) == 1

    await wait_until(dead_lettered, timeout=10, what="the dead letter")
    assert [orjson.loads(m.body)["id"] for m in await drain(settings.amqp_url, dlq)] == [job_id]


@pytest.mark.timeout(120)
async def test_a_retry_waiting_for_a_worker_is_left_alone(
    fsettings: Settings, ledger: Ledger, tmp_path: Path, sweeper: Sweeper
) -> None:
    """The flake's state: RETRYING, attempts=1, its worker dead and not replaced yet, its
    messages ready in the work queue. However long that lasts, the reconciler adds no copy (the
    queue holds the job's way forward), and the next worker to start runs attempt 2."""
    async with running(fsettings, sweeper=False) as stack:
        job_id, db = await _first_attempt(fsettings, stack, tmp_path, ledger, sweeper)
        try:
            await _age(db, 10 * fsettings.reconcile_after)  # a very slow restart
            assert [await sweeper.reconcile() for _ in range(3)] == [0, 0, 0]
            row = await _row(db, job_id)
            assert (row["status"], row["attempts"], row["outbox"]) == ("RETRYING", 1, False)
            # w2 takes one of the two, claims attempt 2 and dies: both are ready again (stale)
            await _second_attempt_fails_the_job(
                fsettings, stack, tmp_path, ledger, sweeper, db, job_id, ready_after=2
            )
        finally:
            await db.close()


@pytest.mark.timeout(120)
async def test_a_lost_retry_is_republished(
    fsettings: Settings, ledger: Ledger, tmp_path: Path, sweeper: Sweeper
) -> None:
    """The retry and the dead worker's requeued delivery are both lost (the work queue purged):
    RETRYING, attempts=1, no message, no outbox row. The reconciler leaves it while it is not yet
    due for ``reconcile_after``, marks it a suspect on the first pass after that and re-publishes
    it on the second; the next worker runs attempt 2."""
    async with running(fsettings, sweeper=False) as stack:
        job_id, db = await _first_attempt(fsettings, stack, tmp_path, ledger, sweeper)
        try:
            assert await purge(fsettings.amqp_url, topology(fsettings).work_queue("suicide")) == 2
            assert [await sweeper.reconcile() for _ in range(2)] == [0, 0]  # not overdue yet
            await _age(db, fsettings.reconcile_after + 1)
            assert await sweeper.reconcile() == 0  # the first pass: a suspect
            assert await sweeper.reconcile() == 1  # the second: re-published
            row = await _row(db, job_id)
            assert (row["status"], row["attempts"]) == ("RETRYING", 1), dict(row)
            await _attempt_ready(fsettings, 1)  # the relay sent the copy
            await _second_attempt_fails_the_job(
                fsettings, stack, tmp_path, ledger, sweeper, db, job_id, ready_after=1
            )
        finally:
            await db.close()
