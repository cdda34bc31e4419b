"""No worker holds a job it cannot run: jobs whose messages were delivered to a worker that is
then frozen (SIGSTOP: a VM pause, a long GC) start on another worker within 15 s of their
delivery, released by a workflow or submitted, with the default settings, and run once.

Three ``conveyor worker`` processes. A (eight slots, type ``work`` only) first claims a job that
waits for a gate file, so it also holds a claimed job when it is frozen. B and C (four slots,
``work`` and ``sync_work``) start, A is frozen, and then come a fan-out whose parent only B and
C run (its children are released when the parent completes, and their messages go round-robin
to the three consumers of ``work``, A's free prefetch included) and a batch of plain ``work``
jobs. Each job's wait is measured in PostgreSQL, from its release (the parent's completion) or
its submit to its start. A's claimed job is bounded by its lease instead: the test waits for it
to start again on another worker before A resumes. After A resumes, nothing runs twice: every
handler records its starts in a ledger.

A second test checks the price: a worker kept busy for over 30 s by CPU-bound sync handlers,
async handlers computing between awaits, and async handlers that block the event loop (until
the loop guard preempts them) keeps its one broker connection."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from conveyor.core.config import Settings

from ..stack import Stack, running_stack
from .harness import Proc, worker_proc

BOUND = 15.0  # a job delivered to a frozen worker starts elsewhere within this (seconds)
WATCH = 40.0  # how long A stays frozen at least (every figure is printed either way)
DELAYED = 3.0  # a job that waited longer was with A (B and C start theirs within a second)
CHILDREN = 9
PLAIN = 9


def _defaults(settings: Settings) -> Settings:
    """The fixture's database, broker and namespace; every other setting at its default (the
    fixture shortens the lease and the sweeps). The API alone gets 10 s for PostgreSQL: it
    shares a loaded machine with three starting workers."""
    return Settings(
        auth="disabled",
        database_url=settings.database_url,
        amqp_url=settings.amqp_url,
        namespace=settings.namespace,
        db_timeout=10.0,
    )


async def _until(what: str, probe: Callable[[], Awaitable[object]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.1)


def broker_sockets(pid: int, broker_port: int) -> dict[int, str]:
    """``pid``'s TCP connections to ``broker_port``: local port → state (``/proc``'s hex code:
    01 established, 08 close-wait: the broker closed it, the process has not; a connection the
    broker reset is no longer listed)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    found: dict[int, str] = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == broker_port:
                    found[int(local.rsplit(":", 1)[1], 16)] = state
    return found


def _broker_port(settings: Settings) -> int:
    return urlsplit(settings.amqp_url.split(",")[0]).port or 5672


def _after(seconds: float | None) -> str:
    return "never" if seconds is None else f"after {seconds:.1f} s"


def _starts(ledger: Path) -> dict[str, int]:
    n: dict[str, int] = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        what, job_id, *_ = line.split()
        if what == "start":
            n[job_id] = n.get(job_id, 0) + 1
    return n


async def _submit_fan_out(stack: Stack, ledger: Path) -> uuid.UUID:
    jobs = [{"key": "parent", "type": "sync_work", "payload": {"ledger": str(ledger)}}]
    jobs += [
        {"key": f"child-{i}", "type": "work", "payload": {"ledger": str(ledger)},
         "after": ["parent"]}
        for i in range(CHILDREN)
    ]  # fmt: skip
    r = await stack.client.post("/workflows", json={"name": "fan-out", "jobs": jobs})
    assert r.status_code == 201, r.text
    return uuid.UUID(r.json()["id"])


async def _submit_plain(stack: Stack, ledger: Path) -> list[uuid.UUID]:
    body = {"jobs": [{"type": "work", "payload": {"ledger": str(ledger)}}] * PLAIN}
    r = await stack.client.post("/jobs/batch", json=body)
    assert r.status_code == 201, r.text
    return [uuid.UUID(j["id"]) for j in r.json()["jobs"]]


async def _waits(
    db: asyncpg.Connection, workflow: uuid.UUID, plain: list[uuid.UUID]
) -> list[asyncpg.Record]:
    """Every job but the parent: whether it was released, its status, attempts, worker and its
    wait in seconds (release or submit → start; None before it started)."""
    return await db.fetch(
        "SELECT j.id, j.workflow_id IS NOT NULL AS released, j.status::text AS status, "
        "j.attempts, j.worker_id, extract(epoch FROM j.started_at - "
        "coalesce(p.finished_at, j.created_at))::float8 AS wait "
        "FROM jobs j LEFT JOIN jobs p ON p.workflow_id = j.workflow_id "
        "AND p.workflow_key = 'parent' "
        "WHERE (j.workflow_id = $1 AND j.workflow_key <> 'parent') OR j.id = ANY($2::uuid[])",
        workflow,
        plain,
    )


@pytest.mark.timeout(300)
async def test_jobs_delivered_to_a_frozen_worker_start_elsewhere_within_15s(
    settings: Settings, db: asyncpg.Connection, tmp_path: Path
) -> None:
    s = _defaults(settings)
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    procs: list[Proc] = []
    try:
        async with running_stack(s, None) as stack:
            a = worker_proc(s, tmp_path, "a", concurrency=8, types=["work"]).start()
            procs.append(a)
            await a.wait_for_log("worker_started", 60)
            held = uuid.UUID(await stack.submit("work", {"ledger": str(ledger), "gate": str(gate)}))

            async def a_runs_it() -> bool:
                row = await db.fetchrow("SELECT status::text, worker_id FROM jobs WHERE id = $1",
                                        held)  # fmt: skip
                return row is not None and row[0] == "IN_PROGRESS" and f":{a.pid}:" in row[1]

            await _until("A runs the gated job", a_runs_it, 30)
            for name in "bc":
                b_or_c = worker_proc(s, tmp_path, name, concurrency=4, types=["work", "sync_work"])
                procs.append(b_or_c.start())
            for p in procs[1:]:
                await p.wait_for_log("worker_started", 60)
            port = _broker_port(s)
            a_sockets = broker_sockets(a.pid, port)
            a.signal(signal.SIGSTOP)
            frozen = time.monotonic()
            workflow = await _submit_fan_out(stack, ledger)
            plain = await _submit_plain(stack, ledger)

            closed_after = rerun_after = None
            while True:
                now = time.monotonic() - frozen
                now_open = broker_sockets(a.pid, port)
                if closed_after is None and any(now_open.get(local) != "01" for local in a_sockets):
                    closed_after = now  # the broker's end: closed (or reset, then gone)
                if rerun_after is None and await db.fetchval(
                    "SELECT attempts >= 2 AND started_at IS NOT NULL FROM jobs WHERE id = $1", held
                ):
                    rerun_after = now
                rows = await _waits(db, workflow, plain)
                done = len(rows) == CHILDREN + PLAIN and all(
                    r["status"] == "COMPLETED" for r in rows
                )
                if (done or now > WATCH) and (rerun_after is not None or now > 60):
                    break
                await asyncio.sleep(0.1)
            a.signal(signal.SIGCONT)
            resumed_after = time.monotonic() - frozen
            gate.touch()
            everything = [*(r["id"] for r in rows), held]

            async def all_completed() -> bool:
                n = await db.fetchval(
                    "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[]) "
                    "AND status = 'COMPLETED'",
                    everything,
                )  # fmt: skip
                return bool(n == len(everything))

            await _until("every job completed", all_completed, 60)
            await asyncio.sleep(3)  # A, resumed, reads what it was sent while frozen
            for p in procs:
                assert await p.stop(30) == 0, p.log()[-3000:]
            final = await _waits(db, workflow, plain)
            held_row = await db.fetchrow("SELECT attempts, worker_id FROM jobs WHERE id = $1", held)
    finally:
        for p in procs:
            p.signal(signal.SIGCONT)
            await p.stop(15)

    def figure(released: bool) -> str:
        waits = sorted(r["wait"] for r in final if r["released"] == released)
        late = [w for w in waits if w > DELAYED]
        return (f"{len(late)} of {len(waits)} started {DELAYED:g}+ s late, the last after "
                f"{waits[-1] if waits else float('nan'):.1f} s")  # fmt: skip

    print(
        f"\nfrozen deliveries: A's broker connection {sorted(a_sockets)} closed by the broker "
        f"{_after(closed_after)}; released: {figure(True)}; submitted: {figure(False)}; "
        f"A's claimed job started again elsewhere {_after(rerun_after)}; "
        f"A resumed after {resumed_after:.1f} s"
    )
    a_id = f":{a.pid}:"
    waits = {r["id"]: r["wait"] for r in final}
    # A did hold jobs of both kinds (a job elsewhere starts within a second)
    for released in (True, False):
        assert any(r["wait"] > DELAYED for r in final if r["released"] == released), final
    late = {str(i): w for i, w in waits.items() if w >= BOUND}
    assert not late, f"not started within {BOUND} s of their delivery: {late}"
    assert all(a_id not in (r["worker_id"] or "") for r in final), final
    # once each: one start in the ledger, one attempt; A's claimed job twice, once per attempt
    starts = _starts(ledger)
    assert {str(r["id"]): 1 for r in final} == {
        str(r["id"]): starts.get(str(r["id"])) for r in final
    }
    assert all(r["status"] == "COMPLETED" and r["attempts"] == 1 for r in final), final
    assert rerun_after is not None
    assert held_row is not None
    assert held_row["attempts"] == 2 and starts[str(held)] == 2, (dict(held_row), starts)
    assert a_id not in held_row["worker_id"], dict(held_row)


BUSY_APP = "tests.faults.busy_app:router"
BUSY_FOR = 30.0  # the price check: a busy worker keeps its connection at least this long


@pytest.mark.timeout(180)
async def test_a_busy_worker_keeps_its_broker_connection(
    settings: Settings, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """With the default heartbeat: four slots computing for over 30 s (sync handlers in their
    threads, async ones between awaits) and async handlers blocking the event loop until the
    loop guard preempts them; the worker's one broker connection stays the same throughout."""
    s = _defaults(settings)
    ledger = str(tmp_path / "ledger")
    port = _broker_port(s)
    async with running_stack(s, None) as stack:
        w = worker_proc(s, tmp_path, "busy", concurrency=4, app=BUSY_APP).start()
        try:
            await w.wait_for_log("worker_started", 60)
            first = broker_sockets(w.pid, port)
            ids = [await stack.submit("blocker", {"seconds": 3, "ledger": ledger}) for _ in "ab"]
            for _ in range(22):
                ids.append(await stack.submit("spin", {"seconds": 3, "ledger": ledger}))
                ids.append(await stack.submit("crunch", {"seconds": 3, "ledger": ledger}))
            t0 = time.monotonic()
            seen: list[dict[int, str]] = []
            while time.monotonic() - t0 < 120:
                seen.append(broker_sockets(w.pid, port))
                statuses = await db.fetchval(
                    "SELECT array_agg(status::text) FROM jobs WHERE id = ANY($1::uuid[])", ids
                )
                if all(st in ("COMPLETED", "FAILED") for st in statuses):
                    break
                await asyncio.sleep(0.25)
            busy = time.monotonic() - t0
            assert await w.stop(30) == 0, w.log()[-3000:]
        finally:
            w.signal(signal.SIGCONT)
            await w.stop(15)
    changed = [ports for ports in seen if ports != first]
    blocked = w.log().count('action="handler_blocked_loop"')
    print(
        f"\nbusy worker: {len(ids)} jobs over {busy:.1f} s, event loop preempted {blocked} times; "
        f"its broker connection {sorted(first)}, {len(changed)} of {len(seen)} samples differ"
        f"{': ' + str(changed[:3]) if changed else ''}"
    )
    assert len(first) == 1 and set(first.values()) == {"01"}, first
    assert busy >= BUSY_FOR, f"busy only {busy:.1f} s"
    assert not changed, changed[:5]
    assert statuses.count("COMPLETED") == 44 and blocked >= 1, (statuses, blocked)
