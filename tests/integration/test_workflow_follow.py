"""A worker runs the workflow jobs its own completions release (worker/follow.py): claimed in the
completing transaction, their outbox rows taken, started at once with the slots it has. Each test
publishes the first job with one relay step and then runs no relay, so whatever ran after it was
claimed by the worker that released it."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from conveyor import Job, JobRouter, JobSpec, Workflow, enqueue, enqueue_many, enqueue_workflow
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper
from conveyor.publisher.relay import Relay
from conveyor.store import ClaimedJob
from conveyor.worker import Worker
from conveyor.worker.completer import LARGE_RESULT_CHARS

from .. import db as tdb
from ..faults.harness import Proc, component_env
from ..stack import wait_for

APP = "tests.integration.worker_apps:router"


class Handlers:
    """Every job runs ``run``; ``gate`` holds the ones waiting on it (the leaves)."""

    def __init__(self) -> None:
        self.router = JobRouter()
        self.running = 0
        self.most = 0
        self.gate = asyncio.Event()
        self.seen: dict[str, Any] = {}
        for name in ("step", "leaf", "limited", "big", "with_key"):
            self.router.job(name)(self.run)

    async def run(self, job: Job) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            self.seen[str(job.id)] = job.parents
            if job.type == "leaf":
                await self.gate.wait()
            if job.type == "big":  # written apart, beside the batch
                return {"n": job.payload.get("i"), "blob": "x" * (LARGE_RESULT_CHARS + 1)}
            if job.type == "with_key":  # a follow-up with a unique key: written apart too
                job.enqueue("step", {"from": str(job.id)}, unique_key=f"once-{job.id}",
                            unique_for=60)  # fmt: skip
            return {"n": job.payload.get("i")}
        finally:
            self.running -= 1


@pytest.fixture
async def relay(settings: Settings) -> AsyncIterator[Relay]:
    r = Relay(settings)
    await r.start()
    yield r
    await r.close()


async def _worker(settings: Settings, h: Handlers, concurrency: int, **kw: Any) -> Worker:
    w = Worker(settings.model_copy(update=kw), h.router, concurrency=concurrency)
    await w.start()
    return w


async def _submit(db: asyncpg.Connection, wf: Workflow) -> dict[str, uuid.UUID]:
    async with db.transaction():
        wid = await enqueue_workflow(db, wf)
    rows = await db.fetch("SELECT workflow_key, id FROM jobs WHERE workflow_id = $1", wid)
    return {r["workflow_key"]: r["id"] for r in rows}


def _chain(*types: str) -> Workflow:
    """Each job after the previous one; keys "0", "1", ..."""
    wf = Workflow("chain")
    for i, job_type in enumerate(types):
        wf.add(str(i), job_type, {"i": i}, after=[str(i - 1)] if i else [])
    return wf


async def _first_published(relay: Relay) -> None:
    assert await relay.run_once() == 1  # the first job only: nothing else is released yet


@pytest.mark.parametrize("run_released", [True, False])
async def test_a_chain_goes_on_without_the_relay_on_the_worker_that_released_each_link(
    settings: Settings, db: asyncpg.Connection, relay: Relay, run_released: bool
) -> None:
    h = Handlers()
    w = await _worker(settings, h, 4, worker_run_released=run_released)
    try:
        key = await _submit(db, _chain(*["step"] * 6))
        await _first_published(relay)
        if not run_released:  # the control: each link waits for the relay
            await wait_for(settings.database_url, [key["0"]], timeout=10)
            await asyncio.sleep(0.5)
            st = dict(await db.fetch("SELECT workflow_key, status::text FROM jobs"))
            assert st["1"] == "PENDING" and st["2"] == "WAITING"
            assert await db.fetchval("SELECT count(*) FROM job_outbox") == 1
            return
        done = await wait_for(settings.database_url, key.values(), timeout=15)
        assert set(done.values()) == {"COMPLETED"}
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0
        workers = await db.fetch("SELECT DISTINCT worker_id FROM job_attempts")
        assert [r["worker_id"] for r in workers] == [w.worker_id]
        assert await db.fetchval("SELECT max(attempt) FROM job_attempts") == 1
        # each link saw its parent's result, read in the transaction that released it
        assert h.seen[str(key["3"])] == {"2": {"n": 2}}
        assert _followed(w, "step") == 5
        # nothing of it went through the broker
        queue = w.subscription.topology.work_queue("step")
        assert (await _ready(w, queue)) == 0
        assert w.consumer.status().claimed_total == 1
    finally:
        await w.stop()


# A completion written apart from the batch (a result over LARGE_RESULT_CHARS, a follow-up with a
# key to wait for) releases its dependent as any does, and the worker runs it in its slot.


@pytest.mark.parametrize("first", ["big", "with_key"])
async def test_a_link_written_apart_hands_its_slot_to_the_job_it_released(
    settings: Settings, db: asyncpg.Connection, relay: Relay, first: str
) -> None:
    h = Handlers()
    w = await _worker(settings, h, 2)
    try:
        key = await _submit(db, _chain(first, "step", "step"))
        await _first_published(relay)
        done = await wait_for(settings.database_url, key.values(), timeout=15)
        assert set(done.values()) == {"COMPLETED"}
        assert _followed(w, "step") == 2  # both links claimed here, none through the relay
        assert h.seen[str(key["1"])]["0"]["n"] == 0  # its parent's result, as written apart
        if first == "big":
            assert len(h.seen[str(key["1"])]["0"]["blob"]) == LARGE_RESULT_CHARS + 1
        else:  # the follow-up committed with the completion, waiting in the outbox
            assert await db.fetchval("SELECT count(*) FROM jobs WHERE workflow_id IS NULL") == 1
            assert await db.fetchval("SELECT count(*) FROM job_outbox") == 1
    finally:
        await w.stop()


def _followed(w: Worker, job_type: str) -> float:
    """Jobs of ``job_type`` the worker claimed where it released them (its metric)."""
    sample = w.metrics.registry.get_sample_value(
        "conveyor_worker_released_claimed_total", {"type": job_type}
    )
    return sample or 0.0


async def _ready(w: Worker, queue: str) -> int:
    channel = w.subscription.channel
    assert channel is not None
    q = await channel.declare_queue(queue, passive=True)
    return int(q.declaration_result.message_count or 0)


async def test_a_worker_with_one_slot_hands_it_to_the_link_it_released(
    settings: Settings, db: asyncpg.Connection, relay: Relay
) -> None:
    h = Handlers()
    w = await _worker(settings, h, 1)
    try:
        key = await _submit(db, _chain(*["step"] * 4))
        await _first_published(relay)
        done = await wait_for(settings.database_url, key.values(), timeout=15)
        assert set(done.values()) == {"COMPLETED"}
        assert h.most == 1
        assert _followed(w, "step") == 3
    finally:
        await w.stop()


async def test_a_fan_out_takes_its_roots_slot_and_leaves_the_rest_to_the_relay(
    settings: Settings, db: asyncpg.Connection, relay: Relay
) -> None:
    h = Handlers()
    w = await _worker(settings, h, 4)
    wf = Workflow("fan")
    root = wf.add("root", "step")
    leaves = [wf.add(f"leaf-{i}", "leaf", {"i": i}, after=[root]) for i in range(10)]
    wf.add("join", "step", after=leaves)
    try:
        key = await _submit(db, wf)
        await _first_published(relay)
        await wait_for(settings.database_url, [key["root"]], timeout=10)
        for _ in range(100):
            if h.running:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        st = dict(await db.fetch("SELECT workflow_key, status::text FROM jobs "
                                 "WHERE workflow_key LIKE 'leaf-%'"))  # fmt: skip
        outboxed = {r["job_id"] for r in await db.fetch("SELECT job_id FROM job_outbox")}
        running = {k for k, s in st.items() if s == "IN_PROGRESS"}
        # one leaf runs here, in the root's slot (the free ones are the broker's to fill); each
        # of the others has its outbox row, and no leaf has both
        assert len(running) == 1 and h.running == 1
        assert {k for k in st if key[k] in outboxed} == set(st) - running
        assert {s for k, s in st.items() if k not in running} == {"PENDING"}
        # the relay publishes the rest; the worker never runs more than its concurrency
        h.gate.set()
        while await relay.run_once():
            pass
        done = await wait_for(settings.database_url, key.values(), timeout=20)
        assert set(done.values()) == {"COMPLETED"}
        assert h.most <= 4
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0
    finally:
        h.gate.set()
        await w.stop()


@pytest.mark.parametrize("control", ["paused", "concurrency"])
async def test_paused_and_limited_types_are_left_to_the_relay(
    settings: Settings, db: asyncpg.Connection, relay: Relay, control: str
) -> None:
    h = Handlers()
    w = await _worker(settings, h, 4)
    try:
        if control == "paused":
            await w.store.type_set_paused(db, "limited", True)
        else:
            await w.store.type_set_limits(
                db, "limited", concurrency=2, rate_limit=None, rate_period=None
            )
        key = await _submit(db, _chain("step", "limited"))
        await _first_published(relay)
        await wait_for(settings.database_url, [key["0"]], timeout=10)
        if control == "concurrency":  # released to admission: no outbox row until admitted
            status = await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", key["1"])
            assert status == "WAITING"
            assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0
            assert await w.store.admit(db, "limited", 10) == 1
        assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", key["1"]) == (
            "PENDING"
        )
        assert [r["job_id"] for r in await db.fetch("SELECT job_id FROM job_outbox")] == [key["1"]]
        assert _followed(w, "limited") == 0
    finally:
        await w.stop()


async def test_a_worker_killed_running_a_job_it_released_loses_nothing(
    settings: Settings, db: asyncpg.Connection, relay: Relay, sweeper: Sweeper, tmp_path: Path
) -> None:
    """A worker process claims the job its completion released (no broker message exists for
    it) and is SIGKILLed while running it: the lease runs out, the sweeper publishes it again,
    another worker runs it and the chain goes on."""
    conveyor = str(Path(sys.executable).parent / "conveyor")
    proc = Proc(
        "worker", [conveyor, "worker", "--app", APP, "--types", "echo,slow"],
        component_env(settings), tmp_path,
    ).start()  # fmt: skip
    try:
        key = await _submit(db, _chain("echo", "slow", "echo"))
        await db.execute("UPDATE jobs SET payload = '{\"seconds\": 600}' WHERE id = $1", key["1"])
        await proc.wait_for_log("worker_started")
        await _first_published(relay)
        await wait_for(settings.database_url, [key["1"]], ["IN_PROGRESS"], timeout=15)
        first = await db.fetchrow("SELECT worker_id, attempts FROM jobs WHERE id = $1", key["1"])
        assert await db.fetchval("SELECT count(*) FROM job_outbox") == 0  # no message for it
        await proc.kill()
    finally:
        await proc.stop()
    # its lease runs out (the fixture's visibility timeout, 5 s)
    await db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                     "WHERE id = $1", key["1"])  # fmt: skip
    assert sum((await sweeper.recover_leases()).values()) == 1
    h = Handlers()
    h.router.job("echo")(h.run)
    h.router.job("slow")(h.run)
    w = await _worker(settings, h, 4)
    try:
        while await relay.run_once():
            pass
        done = await wait_for(settings.database_url, key.values(), timeout=15)
        assert set(done.values()) == {"COMPLETED"}
        again = await db.fetchrow("SELECT worker_id, attempts FROM jobs WHERE id = $1", key["1"])
        assert (first["attempts"], again["attempts"]) == (1, 2)
        assert first["worker_id"] != w.worker_id == again["worker_id"]
        assert _followed(w, "echo") == 1  # the last link followed on the second worker
    finally:
        await w.stop()


async def _until(what: str, test: Any, timeout: float = 10.0) -> None:
    """Poll ``test()`` (the worker's own state: no one-step method waits for it) until true."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not test():
        assert asyncio.get_running_loop().time() < deadline, f"never {what}"
        await asyncio.sleep(0.02)


async def test_a_completion_waiting_on_a_follow_ups_key_holds_none_of_the_free_slots(
    settings: Settings, db_url: str, db: asyncpg.Connection, relay: Relay
) -> None:
    """A workflow job's completion whose unique follow-up waits for an application's open
    transaction (``followups.py``: tried again until the key is free) may take minutes: the
    worker's free slots stay free for other jobs meanwhile. Set aside for the jobs the
    completion may release before the write started, they stayed out of reach for the whole
    wait: a worker of 4 slots ran one job at a time."""
    h = Handlers()

    async def keyed(job: Job) -> None:
        job.enqueue("step", {"from": "keyed"}, unique_for=300, unique_key="held")

    h.router.job("keyed")(keyed)
    w = await _worker(settings, h, 4)
    app = await tdb.connect(db_url)
    tx = app.transaction()
    try:
        await tx.start()  # the application's open transaction holds the key
        await enqueue(app, "step", {"from": "app"}, unique_for=300, unique_key="held")
        key = await _submit(db, _chain("keyed", "step"))
        await _first_published(relay)
        await _until("held by the key", lambda: w.completer.status().held == 1)
        leaves = await enqueue_many(db, [JobSpec("leaf", {"i": i}) for i in range(3)])
        assert await relay.run_once() == 3
        # the three other slots run the leaves while the completion waits
        await _until("three leaves running", lambda: h.running == 3, timeout=5)
        await tx.rollback()  # the key is free: the completion commits with its follow-up
        h.gate.set()
        done = await wait_for(settings.database_url, [*leaves, *key.values()], timeout=15)
        assert set(done.values()) == {"COMPLETED"}
        assert h.most <= 4
    finally:
        h.gate.set()
        await app.close()
        await w.stop()


@pytest.mark.parametrize("claimed", ["after_the_stop", "before_the_stop"])
async def test_a_job_released_while_the_worker_drains_is_handed_back_not_started(
    settings: Settings, db_url: str, db: asyncpg.Connection, relay: Relay, claimed: str
) -> None:
    """SIGTERM while a batch that releases a job is being written, committed after the drain
    has handed back what ran: the released job is not started on a worker that stopped taking
    work; it goes back to PENDING with its outbox row, for any worker. Either the release itself
    comes after the stop (``after_the_stop``: held on the released job's row lock), and the
    worker claims nothing, or the claim came before it and the commit after (``before_the_stop``:
    the drain begins between the claim and the commit), and the worker hands it back. Started
    after the drain's hand-back, it was neither finished within the grace nor handed back: the
    drain waited its bound (15 s) and left it IN_PROGRESS, dropped with the process, until its
    lease ran out."""
    h = Handlers()
    w = await _worker(settings, h, 2)
    locker = await tdb.connect(db_url)
    tx = locker.transaction()
    stop: asyncio.Task[None] | None = None

    async def drain() -> None:
        nonlocal stop
        stop = asyncio.create_task(w.stop(grace=5))
        await _until("flushing", lambda: w.drain.phase == "flushing")

    claim = w.follower.claim

    async def claim_then_drain(conn: Any, room: int) -> list[ClaimedJob]:
        rows = await claim(conn, room)
        if rows and stop is None:  # the batch's transaction commits once the drain flushes
            await drain()
        return rows

    try:
        key = await _submit(db, _chain("step", "leaf"))
        if claimed == "before_the_stop":
            w.follower.claim = claim_then_drain  # type: ignore[method-assign]
            await _first_published(relay)
        else:
            await tx.start()
            await locker.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", key["1"])
            await _first_published(relay)
            deadline = asyncio.get_running_loop().time() + 10
            while not await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND application_name = 'conveyor-worker'"
            ):  # the completion's release waits for the row lock
                assert asyncio.get_running_loop().time() < deadline, "the release never waited"
                await asyncio.sleep(0.02)
            await drain()
            await tx.rollback()  # the batch commits now, the drain past its hand-back
        await _until("stopping", lambda: stop is not None)
        assert stop is not None
        await asyncio.wait_for(stop, 30)
        row = await db.fetchrow("SELECT status::text, attempts FROM jobs WHERE id = $1", key["1"])
        assert row["status"] == "PENDING", dict(row)
        assert str(key["1"]) not in h.seen, "the released job started on a stopped worker"
        assert [r["job_id"] for r in await db.fetch("SELECT job_id FROM job_outbox")] == [key["1"]]
        assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", key["0"]) == (
            "COMPLETED"
        )
        assert _followed(w, "leaf") == 0
    finally:
        h.gate.set()
        await locker.close()
        if stop is None:
            await w.stop()
        elif not stop.done():
            await stop


async def test_a_worker_running_a_job_it_released_takes_no_delivery_it_has_no_slot_for(
    settings: Settings, db: asyncpg.Connection, relay: Relay
) -> None:
    """The prefetch bounds a worker's work in hand (``outcomes.py``: a delivery stays unacked
    while its job runs): a worker of one slot that runs the job its completion released keeps
    the completed job's delivery for it, so the broker sends it nothing more and a job
    published meanwhile goes to a worker with a free slot. With the delivery acknowledged, the
    broker saw a free slot and sent the next job there, to wait in the busy worker's inbox for
    as long as the released job ran, while the other worker sat idle; and the running job was
    invisible to a queue-length autoscaler (KEDA counts unacked messages)."""
    h, other = Handlers(), Handlers()
    busy = await _worker(settings, h, 1)  # step, leaf, limited
    idle = Worker(settings, other.router, types=["step"], concurrency=1)
    await idle.start()
    try:
        key = await _submit(db, _chain("limited", "leaf"))  # only the busy worker runs these
        await _first_published(relay)
        await _until("the leaf running", lambda: h.running == 1 and _followed(busy, "leaf") == 1)
        assert busy._unacked("limited") + busy._unacked("leaf") == 1
        steps = await enqueue_many(db, [JobSpec("step", {"i": i}) for i in range(2)])
        assert await relay.run_once() == 2
        done = await wait_for(settings.database_url, steps, timeout=10)
        assert set(done.values()) == {"COMPLETED"}
        assert busy.consumer.status().waiting == 0 and h.running == 1
        h.gate.set()
        done = await wait_for(settings.database_url, key.values(), timeout=10)
        assert set(done.values()) == {"COMPLETED"}
        assert busy._unacked("limited") + busy._unacked("leaf") == 0
    finally:
        h.gate.set()
        await idle.stop()
        await busy.stop()


async def test_a_handed_over_delivery_is_acknowledged_early_from_its_first_jobs_claim(
    settings: Settings, db: asyncpg.Connection, relay: Relay
) -> None:
    """The delivery a released job takes over has been unacknowledged since the finished job's
    claim: the early ack (before RabbitMQ's ``consumer_timeout`` closes the channel) counts
    from then, not from the released job's start."""
    now = [1000.0]
    h = Handlers()
    first = asyncio.Event()

    async def slow(job: Job) -> None:
        await first.wait()

    h.router.job("first")(slow)
    w = Worker(
        settings.model_copy(update={"early_ack_after": 600.0}),
        h.router,
        concurrency=1,
        clock=lambda: now[0],
    )
    await w.start()
    try:
        key = await _submit(db, _chain("first", "leaf"))
        await _first_published(relay)
        await _until("the first job running", lambda: key["0"] in w.running)
        now[0] += 400.0  # the first job ran 400 s
        first.set()
        await _until("the leaf running", lambda: h.running == 1)
        leaf = w.running[key["1"]]
        assert leaf.delivery is not None and leaf.delivered == 1000.0
        now[0] += 100.0  # the leaf runs 100 s: 500 s since its delivery's claim
        await w.heartbeater.beat_once()
        assert w.heartbeater.status().acked_early_total == 0
        now[0] += 150.0  # 650 s
        await w.heartbeater.beat_once()
        assert w.heartbeater.status().acked_early_total == 1 and leaf.delivery is None
        assert w._unacked("first") + w._unacked("leaf") == 0
    finally:
        first.set()
        h.gate.set()
        await w.stop()


async def test_the_release_listing_holds_the_last_releasing_statements_rows_only(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """``<schema>.wf_released`` lists the outbox rows of the last statement that released jobs
    (what the worker's claim reads, right after its completion statement), not every release of
    the transaction: appended to, it was copied whole by every release statement, a cost
    quadratic in a long transaction's releases (an operator's loop of 60,000 completions in one
    transaction: 25 s before the listing, 45 s with it)."""
    wf = Workflow("pairs")
    for i in range(3):
        wf.add(f"c{i}", "echo", after=[wf.add(f"p{i}", "echo")])
    key = await _submit(db, wf)
    setting = f"{settings.db_schema}.wf_released"
    async with db.transaction():
        for i in range(3):
            await db.execute(
                "UPDATE jobs SET status = 'COMPLETED', finished_at = now() WHERE id = $1",
                key[f"p{i}"],
            )
            listed = await db.fetchval("SELECT current_setting($1, true)", setting)
            row = await db.fetchval("SELECT id FROM job_outbox WHERE job_id = $1", key[f"c{i}"])
            assert listed == str(row), (i, listed)


class _LostCommit:
    """The worker's pool, but the first COMMIT of a transaction that claimed released jobs
    loses its answer: it commits, then the connection looks lost (a failover, a network cut
    while the server committed)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.armed = True

    def acquire(self) -> Any:
        owner, inner = self, self.pool.acquire()

        class Acquired:
            async def __aenter__(self) -> Any:
                return _LostCommitConnection(await inner.__aenter__(), owner)

            async def __aexit__(self, *exc: Any) -> Any:
                return await inner.__aexit__(*exc)

        return Acquired()


class _LostCommitConnection:
    def __init__(self, conn: Any, owner: _LostCommit) -> None:
        self._conn, self._owner, self._claimed = conn, owner, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def fetch(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._claimed = self._claimed or "take_released" in sql  # job_claim_released
        return await self._conn.fetch(sql, *args, **kwargs)

    def transaction(self) -> Any:
        this, inner = self, self._conn.transaction()

        class Transaction:
            async def __aenter__(self) -> Any:
                return await inner.__aenter__()

            async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> Any:
                done = await inner.__aexit__(kind, exc, tb)
                if kind is None and this._claimed and this._owner.armed:
                    this._owner.armed = False
                    raise asyncpg.exceptions.ConnectionDoesNotExistError("lost while committing")
                return done

        return Transaction()


async def test_a_job_claimed_by_a_commit_whose_answer_was_lost_still_runs(
    settings: Settings, db: asyncpg.Connection, relay: Relay
) -> None:
    """The completing transaction commits its claim of a released job, but its answer is lost
    (the connection drops as the server commits): the worker writes the batch again, finds the
    completion written (fenced) and the job claimed under its attempt, and runs it. Taken for
    rolled back, the job stayed IN_PROGRESS with no one running it until its lease ran out, and
    lease recovery then consumed one of its retries (or failed it, with none left) for an
    attempt that never ran."""
    h = Handlers()
    w = await _worker(settings, h, 1)
    w.completer.pool = lost = _LostCommit(w.completer.pool)
    try:
        key = await _submit(db, _chain("step", "leaf"))
        await _first_published(relay)
        await _until("the commit lost", lambda: not lost.armed)
        await _until("the leaf running", lambda: h.running == 1, timeout=5)
        row = await db.fetchrow("SELECT status::text, attempts FROM jobs WHERE id = $1", key["1"])
        assert (row["status"], row["attempts"]) == ("IN_PROGRESS", 1)
        assert _followed(w, "leaf") == 1
        h.gate.set()
        done = await wait_for(settings.database_url, key.values(), timeout=10)
        assert set(done.values()) == {"COMPLETED"}
        assert await db.fetchval("SELECT retry_count FROM jobs WHERE id = $1", key["1"]) == 0
    finally:
        h.gate.set()
        await w.stop()
