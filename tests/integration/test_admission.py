"""Admission (``store/sql/schema/admission.sql``): a job of a limited or partitioned type waits
WAITING with no outbox row until ``admit`` makes it PENDING with one, within every limit, keys in
turn. Every path that makes such a job due again (retry, lease recovery, redrive, a workflow's
release, a worker handing it back) sends it back to admission, never to the broker."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from conveyor import Job, JobRouter, Workflow, enqueue, enqueue_workflow
from conveyor.core.errors import MissingPartitionKey
from conveyor.core.metrics import Metrics
from conveyor.jobs.types import register_router_types, router_types
from conveyor.store import Attempt, Failure, for_schema
from conveyor.store.connect import create_pool
from conveyor.worker import outcomes
from conveyor.worker.completer import Completer, Pending
from conveyor.worker.running import Running

from .. import db as tdb

store = for_schema()


async def _noop(job: object) -> None:
    return None


async def _register(db: asyncpg.Connection, name: str, **options: Any) -> None:
    r = JobRouter()
    r.job(name, **options)(_noop)
    await register_router_types(db, r)


async def _admit(db: asyncpg.Connection, name: str, window: int = 100) -> int:
    return await store.admit(db, name, window)


async def _by_status(db: asyncpg.Connection, name: str) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT status::text AS s, count(*) AS n FROM jobs WHERE job_type = $1 GROUP BY 1", name
    )
    return {r["s"]: r["n"] for r in rows}


async def _outbox(db: asyncpg.Connection, name: str) -> set[uuid.UUID]:
    rows = await db.fetch("SELECT job_id FROM job_outbox WHERE job_type = $1", name)
    return {r["job_id"] for r in rows}


async def _waiting_for(db: asyncpg.Connection, job_id: uuid.UUID) -> str | None:
    row = await store.job_get(db, job_id)
    assert row is not None
    return row.waiting_for


async def _start(db: asyncpg.Connection, name: str) -> None:
    """What a worker's claim does to the admitted jobs (PENDING → IN_PROGRESS)."""
    await db.execute(
        "UPDATE jobs SET status = 'IN_PROGRESS', attempts = attempts + 1, started_at = now(), "
        "lease_expires_at = now() + interval '30 seconds' "
        "WHERE job_type = $1 AND status = 'PENDING'",
        name,
    )
    await db.execute("DELETE FROM job_outbox WHERE job_type = $1", name)


async def test_a_type_without_limits_never_waits_for_admission(db: asyncpg.Connection) -> None:
    await _register(db, "adm_plain")
    job_id = await enqueue(db, "adm_plain", {"a": 1})
    row = await db.fetchrow("SELECT status::text, partition_key FROM jobs WHERE id = $1", job_id)
    assert tuple(row) == ("PENDING", None)
    assert await _outbox(db, "adm_plain") == {job_id}


async def test_the_type_concurrency_admits_up_to_its_limit(db: asyncpg.Connection) -> None:
    await _register(db, "adm_c", concurrency=2)
    ids = [await enqueue(db, "adm_c", {"i": i}) for i in range(5)]
    assert await _by_status(db, "adm_c") == {"WAITING": 5}
    assert await _outbox(db, "adm_c") == set()  # nothing reaches the broker before admission
    assert await _waiting_for(db, ids[0]) is None  # admissible: its turn comes
    assert await _admit(db, "adm_c") == 2
    assert await _outbox(db, "adm_c") == set(ids[:2])  # submit order within the key
    assert await _waiting_for(db, ids[2]) == "type_limit"
    assert await db.fetchval("SELECT admissible('adm_c')") == 0  # held by a limit: none
    assert await _admit(db, "adm_c") == 0  # admitted and not started hold their slots
    await _start(db, "adm_c")
    assert await _admit(db, "adm_c") == 0  # running ones too
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id = $1", ids[0])
    assert await _admit(db, "adm_c") == 1
    assert await _by_status(db, "adm_c") == {
        "COMPLETED": 1, "IN_PROGRESS": 1, "PENDING": 1, "WAITING": 2,
    }  # fmt: skip


async def test_the_window_bounds_what_is_admitted_ahead_of_the_workers(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "adm_win", partition_by="k")
    for i in range(10):
        await enqueue(db, "adm_win", {"k": f"k{i % 2}"})
    assert await _admit(db, "adm_win", window=3) == 3
    assert await _admit(db, "adm_win", window=3) == 0  # three admitted, none started
    await _start(db, "adm_win")
    assert await _admit(db, "adm_win", window=3) == 3
    assert await store.admit(db, "adm_win", 0, dry=True) == 4  # no limit: all that wait
    assert await db.fetchval("SELECT admissible('adm_win')") == 4  # KEDA's query


async def test_the_rate_limit_counts_starts_in_a_sliding_window(db: asyncpg.Connection) -> None:
    await _register(db, "adm_r", rate_limit="3/20s")
    ids = [await enqueue(db, "adm_r", {"i": i}) for i in range(5)]
    assert await _admit(db, "adm_r") == 3
    await _start(db, "adm_r")
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE status = 'IN_PROGRESS'")
    assert await _admit(db, "adm_r") == 0  # finishing frees no start
    assert await _waiting_for(db, ids[3]) == "type_rate"
    await db.execute("UPDATE jobs SET started_at = started_at - interval '21 seconds'")
    assert await _admit(db, "adm_r") == 2


async def test_a_retry_inside_its_rate_window_waits_for_its_own_start_to_leave(
    db: asyncpg.Connection,
) -> None:
    """One job is never two starts of one window: a job whose last start is still in the window
    is not admitted again, whatever room the window has."""
    await _register(db, "adm_rr", partition_rate_limit="2/20s", partition_by="k")
    job_id = await enqueue(db, "adm_rr", {"k": "a"})
    assert await _admit(db, "adm_rr") == 1
    await _start(db, "adm_rr")
    await db.execute("UPDATE jobs SET status = 'RETRYING', run_at = now() WHERE id = $1", job_id)
    assert await _admit(db, "adm_rr") == 0
    assert await _waiting_for(db, job_id) == "partition_rate"
    await db.execute("UPDATE jobs SET started_at = now() - interval '21 seconds'")
    assert await _admit(db, "adm_rr") == 1


async def test_keys_are_served_in_turn(db: asyncpg.Connection) -> None:
    """A key with a backlog delays another key's job by one turn at most: every key's first
    job before any key's second, starting after the key served last."""
    await _register(db, "adm_rr2", partition_by="acct")
    hot = [await enqueue(db, "adm_rr2", {"acct": "hot", "i": i}) for i in range(50)]
    cold = [await enqueue(db, "adm_rr2", {"acct": f"c{i}"}) for i in range(3)]
    assert await _admit(db, "adm_rr2", window=4) == 4
    admitted = await _outbox(db, "adm_rr2")
    assert admitted == set(cold) | {hot[0]}
    await _start(db, "adm_rr2")
    more = [await enqueue(db, "adm_rr2", {"acct": "c0", "i": 2})]
    assert await _admit(db, "adm_rr2", window=2) == 2  # c0's new job, then hot's next
    assert await _outbox(db, "adm_rr2") == {more[0], hot[1]}


async def test_higher_priorities_are_admitted_first(db: asyncpg.Connection) -> None:
    await _register(db, "adm_p", partition_by="k")
    low = [await enqueue(db, "adm_p", {"k": f"k{i}"}, priority=1) for i in range(3)]
    high = await enqueue(db, "adm_p", {"k": "k9"}, priority=9)
    assert await _admit(db, "adm_p", window=1) == 1
    assert await _outbox(db, "adm_p") == {high}
    assert low  # admitted later


async def test_partition_concurrency_is_per_key_and_an_override_wins(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "adm_k", partition_by=("org", "user"), partition_concurrency=1)
    a = [await enqueue(db, "adm_k", {"org": "o", "user": 1, "i": i}) for i in range(3)]
    b = [await enqueue(db, "adm_k", {"org": "o", "user": 2, "i": i}) for i in range(3)]
    keys = await db.fetch("SELECT DISTINCT partition_key FROM jobs WHERE job_type = 'adm_k'")
    assert {k["partition_key"] for k in keys} == {"o/1", "o/2"}
    assert await _admit(db, "adm_k") == 2
    assert await _outbox(db, "adm_k") == {a[0], b[0]}
    assert await _waiting_for(db, a[1]) == "partition_limit"
    await db.execute(
        "INSERT INTO partitions (job_type, key, concurrency) VALUES ('adm_k', 'o/1', 3)"
    )
    assert await _admit(db, "adm_k") == 2  # o/1 may run three now
    await db.execute("UPDATE partitions SET paused = true WHERE key = 'o/1'")
    await _start(db, "adm_k")
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE job_type = 'adm_k' "
                     "AND status = 'IN_PROGRESS'")  # fmt: skip
    assert await _admit(db, "adm_k") == 1  # o/2 only: o/1 is paused
    assert await _waiting_for(db, b[2]) == "partition_limit"


async def test_a_partitioned_type_refuses_a_job_without_a_key(db: asyncpg.Connection) -> None:
    await _register(db, "adm_m", partition_by="acct", partition_concurrency=2)
    with pytest.raises(MissingPartitionKey, match="acct"):
        await enqueue(db, "adm_m", {"other": 1})
    with pytest.raises(MissingPartitionKey):
        await enqueue(db, "adm_m", {"acct": {"nested": 1}})  # not a string, number or boolean
    job_id = await enqueue(db, "adm_m", {"other": 1}, partition_key="given")
    assert await db.fetchval("SELECT partition_key FROM jobs WHERE id = $1", job_id) == "given"
    await _register(db, "adm_m2", partition_concurrency=2)  # keys only from submits
    with pytest.raises(MissingPartitionKey, match="partition_key"):
        await enqueue(db, "adm_m2", {"acct": 1})


async def test_a_paused_type_admits_nothing(db: asyncpg.Connection) -> None:
    await _register(db, "adm_pz", concurrency=3)
    job_id = await enqueue(db, "adm_pz", {})
    assert await store.type_set_paused(db, "adm_pz", True)
    assert await _admit(db, "adm_pz") == 0
    assert await _waiting_for(db, job_id) == "paused"
    assert await store.type_set_paused(db, "adm_pz", False)
    assert await _admit(db, "adm_pz") == 1


async def test_every_way_back_to_due_goes_through_admission(db: asyncpg.Connection) -> None:
    """A retry, a lease recovery, a redrive and a hand-back make the job WAITING with no outbox
    row (the pen message a retry would take would bypass admission)."""
    await _register(db, "adm_back", concurrency=5)
    ids = [await enqueue(db, "adm_back", {"i": i}) for i in range(4)]
    assert await _admit(db, "adm_back") == 4
    await _start(db, "adm_back")
    retried, recovered, failed, handed = ids
    await store.job_fail_many(db, [Failure(retried, 1, "boom", 5, True)])
    await db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 s' WHERE id = $1",
                     recovered)  # fmt: skip
    await store.job_recover_expired(db, [recovered], default_max_retries=3)
    await store.job_fail_many(db, [Failure(failed, 1, "dead", None, True)])
    await store.job_release_many(db, [Attempt(handed, 1)])
    rows = {r["id"]: (r["s"], r["run_at_ahead"]) for r in await db.fetch(
        "SELECT id, status::text AS s, run_at > now() AS run_at_ahead FROM jobs "
        "WHERE job_type = 'adm_back'")}  # fmt: skip
    assert rows[retried] == ("WAITING", True)  # due at its retry time, admitted then
    assert rows[recovered] == ("WAITING", True)
    assert rows[failed][0] == "FAILED"
    assert rows[handed][0] == "WAITING"
    outbox = await db.fetch("SELECT job_id, destination FROM job_outbox")
    assert {(r["job_id"], r["destination"]) for r in outbox} == {(failed, "dead")}
    assert await _waiting_for(db, retried) == "run_at"
    assert await store.job_redrive(db, [failed]) == [failed]
    assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", failed) == "WAITING"
    assert await _admit(db, "adm_back") == 2  # the hand-back and the redrive
    await db.execute("UPDATE jobs SET run_at = now() WHERE job_type = 'adm_back'")
    assert await _admit(db, "adm_back") == 2


async def test_a_workflow_job_of_a_limited_type_is_released_to_admission(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "adm_wf", concurrency=1)
    await _register(db, "adm_first")
    wf = Workflow("adm")
    first = wf.add("first", "adm_first", {})
    wf.add("a", "adm_wf", {}, after=[first])
    wf.add("b", "adm_wf", {}, after=[first])
    await enqueue_workflow(db, wf)
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE job_type = 'adm_first'")
    assert await _by_status(db, "adm_wf") == {"WAITING": 2}
    assert await _outbox(db, "adm_wf") == set()
    assert await _admit(db, "adm_wf") == 1


async def test_ordered_keys_start_in_commit_order_one_at_a_time(
    db: asyncpg.Connection, db_url: str
) -> None:
    """Two transactions submit to one key: the one that commits first goes first, whatever its
    id (taken at insert) says."""
    await _register(db, "adm_o", partition_by="acct", ordered=True)
    early, late = await tdb.connect(db_url), await tdb.connect(db_url)
    try:
        tx = early.transaction()
        await tx.start()
        first_inserted = await enqueue(early, "adm_o", {"acct": "a", "n": 1})
        second_inserted = await enqueue(late, "adm_o", {"acct": "a", "n": 2})  # commits first
        await tx.commit()
    finally:
        await early.close()
        await late.close()
    seq = dict(await db.fetch("SELECT id, admit_seq FROM jobs WHERE job_type = 'adm_o'"))
    assert seq[second_inserted] < seq[first_inserted]
    assert await _admit(db, "adm_o") == 1
    assert await _outbox(db, "adm_o") == {second_inserted}
    assert await _waiting_for(db, first_inserted) == "ordered"
    await _start(db, "adm_o")
    await store.job_fail_many(db, [Failure(second_inserted, 1, "boom", None, True)])
    assert await _admit(db, "adm_o") == 0  # a FAILED head holds its key ('hold')
    assert await _waiting_for(db, first_inserted) == "ordered"
    await db.execute("SELECT conveyor.cancel_job($1)", second_inserted)
    assert await _admit(db, "adm_o") == 1  # cancelled by an operator: the key goes on


async def test_an_ordered_key_under_continue_passes_a_failed_head(db: asyncpg.Connection) -> None:
    await _register(db, "adm_oc", partition_by="acct", ordered="continue")
    a, b = [await enqueue(db, "adm_oc", {"acct": "x", "n": n}) for n in range(2)]
    assert await _admit(db, "adm_oc") == 1
    await _start(db, "adm_oc")
    await store.job_fail_many(db, [Failure(a, 1, "boom", None, True)])
    assert await _admit(db, "adm_oc") == 1
    assert b in await _outbox(db, "adm_oc")


async def test_concurrent_admitters_never_admit_past_a_limit(
    db: asyncpg.Connection, db_url: str
) -> None:
    await _register(db, "adm_x", partition_by="k", partition_concurrency=2, concurrency=7)
    for i in range(60):
        await enqueue(db, "adm_x", {"k": f"k{i % 6}"})
    conns = [await tdb.connect(db_url) for _ in range(4)]
    try:
        for _ in range(3):
            await asyncio.gather(*(_admit(c, "adm_x") for c in conns))
    finally:
        for c in conns:
            await c.close()
    assert await _by_status(db, "adm_x") == {"PENDING": 7, "WAITING": 53}
    per_key = await db.fetch("SELECT partition_key, count(*) AS n FROM jobs "
                             "WHERE status = 'PENDING' GROUP BY 1")  # fmt: skip
    assert max(r["n"] for r in per_key) <= 2


async def test_operator_limits_survive_a_worker_registering_the_type(
    db: asyncpg.Connection,
) -> None:
    r = JobRouter()
    r.job("adm_ol", concurrency=5, rate_limit="100/m", partition_by="a")(_noop)
    await store.job_type_register_many(db, router_types(r))
    row = await db.fetchrow("SELECT concurrency, rate_limit, rate_period, limits_set_at, "
                            "partition_by FROM job_types WHERE name = 'adm_ol'")  # fmt: skip
    assert tuple(row) == (5, 100, 60, None, ["a"])
    await store.type_set_limits(db, "adm_ol", concurrency=2, rate_limit=None, rate_period=None)
    await store.job_type_register_many(db, router_types(r))  # a worker restarts
    row = await db.fetchrow("SELECT concurrency, rate_limit, limits_set_at FROM job_types "
                            "WHERE name = 'adm_ol'")  # fmt: skip
    assert row["concurrency"] == 2 and row["rate_limit"] is None
    assert row["limits_set_at"] is not None


async def test_the_turn_goes_round_every_key_though_a_pass_reads_a_few(
    db: asyncpg.Connection,
) -> None:
    """300 keys with two jobs each, a window of 10: each pass reads at most 2 x 10 + 100 keys
    from where the last one stopped, so the turn goes round all keys: no key's second job
    before every key's first."""
    await _register(db, "adm_round", partition_by="k")
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, partition_key) "
        "SELECT gen_random_uuid(), 'adm_round', 'WAITING', 5, '{}', 'k' || lpad(i::text, 3, '0') "
        "FROM generate_series(1, 300) i, generate_series(1, 2)"
    )
    served: list[str] = []
    for _ in range(31):
        assert await _admit(db, "adm_round", window=10) == 10
        rows = await db.fetch(
            "UPDATE jobs SET status = 'COMPLETED' WHERE job_type = 'adm_round' "
            "AND status = 'PENDING' RETURNING partition_key"
        )
        served += sorted(r["partition_key"] for r in rows)
    firsts = served[:300]
    assert sorted(firsts) == [f"k{i:03d}" for i in range(1, 301)]  # every key once ...
    assert served[300:310] == [f"k{i:03d}" for i in range(1, 11)]  # ... then round again


async def test_an_outcome_admits_the_next_job_in_its_own_transaction(
    db: asyncpg.Connection, db_url: str
) -> None:
    """The worker's completion of a limited job frees its slot and admits the key's next job in
    the same commit: no admission duty runs here."""
    await _register(db, "adm_next", partition_by="k", partition_concurrency=1)
    ids = [await enqueue(db, "adm_next", {"k": "a", "i": i}) for i in range(3)]
    assert await _admit(db, "adm_next") == 1
    await db.execute("DELETE FROM job_outbox")  # the relay published it
    [claimed] = await store.job_claim_many(
        db, [ids[0]], lease_seconds=30.0, worker_id="w", types=["adm_next"],
        handler_defaults={}, default_max_retries=3,
    )  # fmt: skip
    assert claimed.admitted
    pool = await create_pool(db_url, application_name="test-admission", max_size=2)
    written: list[Pending] = []

    async def record(batch: list[Pending]) -> None:
        written.extend(batch)

    completer = Completer(pool, store, Metrics(), done=record, admission_window=10)
    try:
        running = Running(Job(ids[0], "adm_next", {}, claimed.attempts, 5, 0, 3), None, None, 0.0)
        running.admitted = True
        completer.put(running, outcomes.completed({"ok": True}))
        assert await completer.flush_once() == 1
    finally:
        await pool.close()
    assert await _outbox(db, "adm_next") == {ids[1]}
    assert await _by_status(db, "adm_next") == {"COMPLETED": 1, "PENDING": 1, "WAITING": 1}


async def test_an_operators_retry_skips_the_delay_of_a_retry_waiting_for_admission(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "adm_rt", concurrency=1)
    job_id = await enqueue(db, "adm_rt", {})
    assert await _admit(db, "adm_rt") == 1
    await _start(db, "adm_rt")
    await store.job_fail_many(db, [Failure(job_id, 1, "boom", 3600, True)])
    assert await _waiting_for(db, job_id) == "run_at"
    assert await db.fetchval("SELECT conveyor.retry_job($1)", job_id) == "WAITING"
    assert await _admit(db, "adm_rt") == 1


async def test_a_pass_reads_at_most_twice_its_room_plus_100_keys(db: asyncpg.Connection) -> None:
    """2,000 keys with a waiting job each, a window of 1: one pass may read 2 x 1 + 100 keys (a
    probe of ``jobs_admit_idx`` each, and one for each key it considers), not all 2,000.
    Counted with the index scans of this transaction (``pg_stat_get_xact_numscans``)."""
    await _register(db, "adm_budget", partition_by="k")
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, partition_key) "
        "SELECT gen_random_uuid(), 'adm_budget', 'WAITING', 5, '{}', 'k' || lpad(i::text, 4, '0') "
        "FROM generate_series(1, 2000) i"
    )
    scans = "SELECT pg_stat_get_xact_numscans('jobs_admit_idx'::regclass)"
    async with db.transaction():
        before = await db.fetchval(scans)
        assert await _admit(db, "adm_budget", window=1) == 1
        read = await db.fetchval(scans) - before
    assert read <= 2 * (2 * 1 + 100) + 10, f"one pass scanned jobs_admit_idx {read} times"


async def test_a_keys_rate_window_is_read_by_its_own_index_with_stale_statistics(
    db: asyncpg.Connection,
) -> None:
    """Statistics taken before the window's starts (ANALYZE of an empty table): a pass counts
    each key's starts through ``jobs_key_starts_idx``, never through the type's index (which
    cannot serve a key's query: at 10,000 keys the bench saw it chosen, each key reading every
    start of the type), and locks the jobs it admits by their ids: without ``enable_seqscan =
    off`` on ``admit()`` that lock read the whole table (12,000 rows here)."""
    await _register(db, "adm_stale", partition_by="k", partition_rate_limit="10/h")
    await db.execute("ANALYZE jobs")
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, partition_key, attempts, "
        "started_at, finished_at) SELECT gen_random_uuid(), 'adm_stale', 'COMPLETED', 5, '{}', "
        "'k' || lpad(i::text, 4, '0'), 1, now() - interval '10 minutes', now() "
        "FROM generate_series(1, 2000) i, generate_series(1, 5)"
    )
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, partition_key) "
        "SELECT gen_random_uuid(), 'adm_stale', 'WAITING', 5, '{}', 'k' || lpad(i::text, 4, '0') "
        "FROM generate_series(1, 2000) i"
    )
    scans = (
        "SELECT pg_stat_get_xact_numscans('jobs_type_starts_idx'::regclass), "
        "pg_stat_get_xact_numscans('jobs_key_starts_idx'::regclass), "
        "pg_stat_get_xact_tuples_returned('jobs'::regclass)"
    )
    async with db.transaction():
        before = await db.fetchrow(scans)
        assert await _admit(db, "adm_stale", window=50) == 50
        after = await db.fetchrow(scans)
    assert after[0] - before[0] == 0  # the type's index: never
    assert after[1] - before[1] > 0  # each key's own
    assert after[2] - before[2] == 0  # no sequential scan read a row
