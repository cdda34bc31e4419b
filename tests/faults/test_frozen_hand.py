"""A worker frozen (SIGSTOP: a VM pause, a long GC) with jobs of a limited type *held in its hand*
does not keep them from the rest of the fleet for longer than its hold.

A held job's delivery was acknowledged when it was held: no message is left anywhere, and only
the hold (``lease_expires_at``, renewed by the holder's heartbeat) says it is in a hand. Worker
B runs two long jobs, filling the type's limit of two; worker A starts, takes jobs into its hand
(its log's ``job_held`` with ``pen`` 0; the database shows them PENDING, held, with no outbox
row) and is frozen. B's long jobs end, and the test measures how long until B has run every job
of A's hand. ``sweep``: A's hand is the whole backlog, so nothing else is claimed and the lease
sweep (every 2 s) must publish the jobs again once their hold has run out. ``claims``: a backlog
of 30 sits in the queue, and B's claims take A's jobs while their hold lasts (fresh deliveries
leave their slots to jobs held in other hands). A hold is ``visibility_timeout``, lowered to
10 s here (the sweeper's intervals are the defaults); without the hold's takeover only the
reconciler would find the jobs, far later. Then A resumes: none of its jobs runs twice (its
hand's claims find them finished; the handlers' ledger shows one start per job)."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import asyncpg
import pytest

from conveyor.core.config import Settings

from .hand_fleet import hand_fleet, held_in_hand

HOLD = 10.0  # visibility_timeout: a running job's lease, a held job's hold
WAIT = 120.0  # how long the test watches for the takeover (the figure is printed either way)


async def _status(db: asyncpg.Connection, ids: list[uuid.UUID]) -> dict[uuid.UUID, asyncpg.Record]:
    rows = await db.fetch(
        "SELECT j.id, j.status::text AS status, j.worker_id, j.attempts, "
        "j.lease_expires_at > now() AS held, "
        "EXISTS (SELECT 1 FROM job_outbox o WHERE o.job_id = j.id) AS queued "
        "FROM jobs j WHERE j.id = ANY($1::uuid[])",
        ids,
    )
    return {r["id"]: r for r in rows}


async def _until(what: str, probe: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)


def _starts(ledger: Path) -> dict[str, int]:
    n: dict[str, int] = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        what, job_id, *_ = line.split()
        if what == "start":
            n[job_id] = n.get(job_id, 0) + 1
    return n


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backlog", [4, 30], ids=["sweep", "claims"])
async def test_jobs_held_in_a_frozen_workers_hand_are_taken_over_within_a_hold(
    settings: Settings,
    db: asyncpg.Connection,
    tmp_path: Path,
    backlog: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with hand_fleet(
        settings, db, tmp_path, visibility_timeout=HOLD, lease_sweep_interval=2.0
    ) as fleet:
        b = await fleet.worker("b")
        # B fills the type's limit with two long jobs
        long = [await fleet.submit(12) for _ in "ab"]

        async def b_runs_both() -> bool:
            rows = await _status(db, [uuid.UUID(i) for i in long])
            return all(r["status"] == "IN_PROGRESS" for r in rows.values())

        await _until("B runs the two long jobs", b_runs_both, 30)
        a = await fleet.worker("a", fleet.settings.model_copy(update={"log_level": "DEBUG"}))
        # B's deliveries of the long jobs are unacknowledged until they finish: its prefetch
        # (its concurrency) is full, so A receives these
        rest = [await fleet.submit(0.1) for _ in range(backlog)]
        hand: list[uuid.UUID] = []

        async def a_holds_jobs() -> bool:
            nonlocal hand
            hand = [job for job, _ in held_in_hand(a.log())]
            if len(hand) < 4:
                return False
            rows = await _status(db, hand)
            return all(
                r["status"] == "PENDING" and r["held"] and not r["queued"] for r in rows.values()
            )

        await _until("A holds four jobs in hand", a_holds_jobs, 30)
        assert await b_runs_both(), "B's long jobs ended before A was frozen"
        a.signal(signal.SIGSTOP)
        frozen = time.monotonic()

        async def hand_done() -> bool:
            rows = await _status(db, hand)
            return all(r["status"] == "COMPLETED" for r in rows.values())

        taken_over: float | None = None
        try:
            await _until("B runs A's hand", hand_done, WAIT)
            taken_over = time.monotonic() - frozen
        except AssertionError:
            pass
        rows = await _status(db, hand)
        # A resumes: its hand's claims must find the jobs finished, not run them again
        a.signal(signal.SIGCONT)
        everything = [uuid.UUID(i) for i in long + rest]

        async def all_done() -> bool:
            got = await _status(db, everything)
            return all(r["status"] == "COMPLETED" for r in got.values())

        await _until("every job completed", all_done, 60)
        # the waiting loop claims its hand again at least every second (RETRY_MAX): three
        # of its passes after the resume, then A drains and exits
        await asyncio.sleep(3)
        assert await a.stop(30) == 0, a.log()[-3000:]
        assert await b.stop(30) == 0, b.log()[-3000:]
        final = await _status(db, everything)
    took = f"after {taken_over:.1f} s" if taken_over is not None else f"not within {WAIT} s"
    print(
        f"\nfrozen hand ({backlog} jobs): A held {len(hand)}; B ran them all {took} "
        f"(hold {HOLD} s, lease sweep 2 s, reconcile_after {settings.reconcile_after} s)"
    )
    b_pid = f":{b.pid}:"
    assert taken_over is not None, {i: dict(r) for i, r in rows.items()}
    assert all(b_pid in (r["worker_id"] or "") for r in rows.values()), rows
    # about one hold after A's last renewal (at most one heartbeat before the freeze), plus a
    # sweep interval, the relay and B's run; the reconciler alone would be far later
    assert taken_over < HOLD + 8, taken_over
    expired = [r for r in caplog.records if r.getMessage() == "job_hold_expired"]
    if backlog == len(hand):  # nothing else claimed: the lease sweep published them again
        assert len(expired) == len(hand), len(expired)
    starts = _starts(Path(fleet.ledger))
    assert {str(i) for i in everything} == set(starts)
    assert all(n == 1 for n in starts.values()), {k: n for k, n in starts.items() if n > 1}
    assert all(r["attempts"] == 1 for r in final.values())
