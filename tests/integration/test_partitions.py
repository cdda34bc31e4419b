"""The operators' side of partition keys (``store/sql/types.sql``: ``partition_page``,
``partition_get``, ``partition_set``): which keys a type lists and how each is counted, the keyset
walk, an override kept until removed (an ordered key's commit counter never lost), the
and what a key's pause or concurrency does to admission (``store.admit``, one
pass at a time: no timing). The list's plan at 10,000 keys reads indexes only."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from conveyor import enqueue
from conveyor.jobs.types import register_router_types
from conveyor.store import PartitionRow, for_schema
from conveyor.store.registry import bind

from .plans import partition_keys_sql, scans
from .test_admission import _register, _start

store = for_schema()
ADMISSION_DOC = (Path(__file__).resolve().parents[2] / "docs" / "admission.md").read_text()


async def _set(db: asyncpg.Connection, name: str, key: str, **kw: Any) -> PartitionRow | None:
    async with db.transaction():
        return await store.partition_set(db, name, key, **kw)


async def _all(db: asyncpg.Connection, name: str, limit: int) -> list[PartitionRow]:
    """Every key, walked a page of ``limit`` at a time."""
    out: list[PartitionRow] = []
    after: tuple[dt.datetime | None, str] | None = None
    while True:
        page = await store.partition_page(db, name, after=after, limit=limit)
        out += page
        if len(page) < limit:
            return out
        after = (page[-1].since, page[-1].key)


async def _admitted_keys(db: asyncpg.Connection, name: str) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT partition_key AS k, count(*) AS n FROM jobs WHERE job_type = $1 "
        "AND status = 'PENDING' GROUP BY 1",
        name,
    )
    return {r["k"]: r["n"] for r in rows}


async def test_the_list_counts_each_key_oldest_wait_first(db: asyncpg.Connection) -> None:
    await _register(db, "pk_list", partition_by="acct", partition_concurrency=2)
    for acct, n in (("old", 3), ("mid", 1), ("new", 2)):
        for i in range(n):
            await enqueue(db, "pk_list", {"acct": acct, "i": i})
    await db.execute(
        "UPDATE jobs SET created_at = now() - make_interval(secs => CASE partition_key "
        "WHEN 'old' THEN 300 WHEN 'mid' THEN 200 ELSE 100 END)"
    )
    assert await store.admit(db, "pk_list", 100) == 5  # two of old, one of mid, two of new
    await db.execute("UPDATE jobs SET status = 'IN_PROGRESS', started_at = now() "
                     "WHERE id = (SELECT id FROM jobs WHERE partition_key = 'old' "
                     "AND status = 'PENDING' LIMIT 1)")  # fmt: skip
    # an override with no job is listed (to be seen and removed); a key of no job without
    # one is not, nor a type's '' (limited as a whole)
    assert await _set(db, "pk_list", "idle", concurrency=7)
    await _register(db, "pk_whole", concurrency=1)
    await enqueue(db, "pk_whole", {})
    page = await store.partition_page(db, "pk_list", after=None, limit=100)
    got = [(r.key, r.waiting, r.admitted, r.running, r.limit, r.concurrency, r.paused)
           for r in page]  # fmt: skip
    assert got == [
        ("old", 1, 1, 1, 2, None, False),
        # nothing waits: after the keys that wait, by key
        ("idle", 0, 0, 0, 7, 7, False),
        ("mid", 0, 1, 0, 2, None, False),
        ("new", 0, 2, 0, 2, None, False),
    ]
    old = page[0]
    assert old.oldest_wait_seconds is not None and 299 <= old.oldest_wait_seconds < 330
    assert all(r.oldest_wait_seconds is None and r.since is None for r in page[1:])
    assert await store.partition_page(db, "pk_whole", after=None, limit=10) == []
    assert await store.partition_page(db, "pk_nope", after=None, limit=10) == []


async def test_the_wait_counts_from_a_later_run_at_and_only_due_jobs(
    db: asyncpg.Connection,
) -> None:
    """A retry waits from its retry time, not from its submit; a job not due yet (a retry
    ahead) does not wait for admission yet."""
    await _register(db, "pk_due", partition_by="k")
    a = await enqueue(db, "pk_due", {"k": "a"})
    b = await enqueue(db, "pk_due", {"k": "b"})
    await db.execute("UPDATE jobs SET created_at = now() - interval '1 hour'")
    await db.execute("UPDATE jobs SET run_at = now() - interval '10 seconds' WHERE id = $1", a)
    await db.execute("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE id = $1", b)
    rows = {r.key: r for r in await _all(db, "pk_due", 10)}
    assert rows["a"].oldest_wait_seconds is not None
    assert 10 <= rows["a"].oldest_wait_seconds < 60
    assert rows["b"].waiting == 1 and rows["b"].oldest_wait_seconds is None


async def test_the_keyset_walk_lists_every_key_once(db: asyncpg.Connection) -> None:
    """Ties of the wait are broken by key; the keys with nothing waiting come last."""
    await _register(db, "pk_walk", partition_by="k", partition_concurrency=1)
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, created_at, partition_key) "
        "SELECT gen_random_uuid(), 'pk_walk', 'WAITING', 5, '{}', "
        # five waits shared by many keys: ties across page boundaries
        "  now() - make_interval(secs => (i % 5) * 60), 'k' || i "
        "FROM generate_series(1, 47) i"
    )
    await db.execute("UPDATE jobs SET status = 'PENDING' WHERE partition_key IN ('k3', 'k9')")
    for i in range(3):
        await _set(db, "pk_walk", f"override{i}", paused=True)
    for limit in (1, 4, 10, 100):
        rows = await _all(db, "pk_walk", limit)
        keys = [r.key for r in rows]
        assert len(keys) == len(set(keys)) == 50, limit
        never = dt.datetime.max.replace(tzinfo=dt.UTC)
        assert rows == sorted(rows, key=lambda r: (r.since or never, r.key)), limit
        assert sum(r.since is None for r in rows) == 5  # k3, k9 and the overrides: last


async def test_an_override_is_kept_until_removed(db: asyncpg.Connection) -> None:
    await _register(db, "pk_set", partition_by="k", partition_concurrency=2)
    await enqueue(db, "pk_set", {"k": "a/b ü"})
    row = await _set(db, "pk_set", "a/b ü", concurrency=5)
    assert row is not None and (row.concurrency, row.limit, row.paused) == (5, 5, False)
    assert row.waiting == 1
    row = await _set(db, "pk_set", "a/b ü", paused=True)  # concurrency left as it is
    assert row is not None and (row.concurrency, row.paused) == (5, True)
    row = await _set(db, "pk_set", "a/b ü", concurrency=None)  # the type's limit again
    assert row is not None and (row.concurrency, row.limit, row.paused) == (None, 2, True)
    assert await db.fetchval("SELECT count(*) FROM partitions") == 1
    row = await _set(db, "pk_set", "a/b ü", paused=False)  # nothing left: the row goes
    assert row is not None and (row.concurrency, row.limit, row.paused) == (None, 2, False)
    assert await db.fetchval("SELECT count(*) FROM partitions") == 0
    row = await _set(db, "pk_set", "never", concurrency=None, paused=False)  # nothing to keep
    assert row is not None and row.waiting == 0
    assert await db.fetchval("SELECT count(*) FROM partitions") == 0
    assert await _set(db, "pk_nope", "a", paused=True) is None
    assert await store.partition_get(db, "pk_nope", "a") is None
    assert await db.fetchval("SELECT count(*) FROM partitions") == 0


async def test_removing_an_ordered_keys_override_keeps_its_commit_counter(
    db: asyncpg.Connection,
) -> None:
    """``seq`` gives an ordered key's next job its place: deleting the row would start the
    places again at 1, before the key's waiting jobs."""
    await _register(db, "pk_ord", partition_by="k", ordered=True)
    first = await enqueue(db, "pk_ord", {"k": "a", "n": 1})
    await _set(db, "pk_ord", "a", paused=True)
    await _set(db, "pk_ord", "a", concurrency=None, paused=False)
    row = await db.fetchrow("SELECT concurrency, paused, seq FROM partitions WHERE key = 'a'")
    assert tuple(row) == (None, False, 1)
    second = await enqueue(db, "pk_ord", {"k": "a", "n": 2})
    seq = dict(await db.fetch("SELECT id, admit_seq FROM jobs WHERE job_type = 'pk_ord'"))
    assert seq[first] < seq[second]
    # and a counter alone is no override: the key is listed for its jobs only
    page = await store.partition_page(db, "pk_ord", after=None, limit=10)
    assert [(r.key, r.waiting, r.limit) for r in page] == [("a", 2, 1)]  # one at a time
    row = await _set(db, "pk_ord", "a", concurrency=5)  # an override cannot lift that
    assert row is not None and (row.concurrency, row.limit) == (5, 1)
    await _set(db, "pk_ord", "a", concurrency=None)
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE job_type = 'pk_ord'")
    assert await store.partition_page(db, "pk_ord", after=None, limit=10) == []


async def test_a_paused_key_is_not_admitted_while_the_others_go_on(
    db: asyncpg.Connection,
) -> None:
    await _register(db, "pk_pause", partition_by="acct", partition_concurrency=1)
    for i in range(3):
        for acct in ("a", "b", "c"):
            await enqueue(db, "pk_pause", {"acct": acct, "i": i})
    await _set(db, "pk_pause", "b", paused=True)
    assert await store.admit(db, "pk_pause", 100) == 2
    assert await _admitted_keys(db, "pk_pause") == {"a": 1, "c": 1}
    job = await db.fetchval("SELECT id FROM jobs WHERE partition_key = 'b' LIMIT 1")
    assert (await store.job_get(db, job)).waiting_for == "paused"  # type: ignore[union-attr]
    await _start(db, "pk_pause")
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE status = 'IN_PROGRESS'")
    assert await store.admit(db, "pk_pause", 100) == 2
    assert await _admitted_keys(db, "pk_pause") == {"a": 1, "c": 1}
    await _set(db, "pk_pause", "b", paused=False)  # resumed: b takes its turn again
    assert await store.admit(db, "pk_pause", 100) == 1
    assert await _admitted_keys(db, "pk_pause") == {"a": 1, "b": 1, "c": 1}


async def test_a_keys_concurrency_override_admits_up_to_it(db: asyncpg.Connection) -> None:
    await _register(db, "pk_conc", partition_by="acct", partition_concurrency=1)
    for i in range(5):
        await enqueue(db, "pk_conc", {"acct": "big", "i": i})
    row = await _set(db, "pk_conc", "big", concurrency=3)
    assert row is not None and row.limit == 3
    assert await store.admit(db, "pk_conc", 100) == 3
    row = await _set(db, "pk_conc", "big", concurrency=None)
    assert row is not None and (row.limit, row.admitted, row.waiting) == (1, 3, 2)
    await _start(db, "pk_conc")
    await db.execute("UPDATE jobs SET status = 'COMPLETED' WHERE id IN (SELECT id FROM jobs "
                     "WHERE status = 'IN_PROGRESS' LIMIT 2)")  # fmt: skip
    assert await store.admit(db, "pk_conc", 100) == 0  # one runs: the type's limit of 1


# ---------------------------------------------------------------------- the plan at 10,000 keys

# ``plans.partition_keys_sql``: 10,000 keys of 10 WAITING jobs each, 2,000 of them with an admitted
# and a running job, 100 overrides; beside them the history of the type and of another (200,000
# finished jobs: an install keeps a week of them). On a table of nothing but these keys' waiting
# jobs, reading it whole is the cheaper plan, and PostgreSQL rightly takes it.
HISTORY = (
    "INSERT INTO jobs (id, job_type, status, priority, payload, created_at, started_at, "
    "                  finished_at, partition_key) "
    "SELECT gen_random_uuid(), CASE WHEN i % 2 = 0 THEN 'pk_big' ELSE 'pk_other' END, "
    "  'COMPLETED', 5, '{}', now() - interval '1 day', now(), now(), "
    "  CASE WHEN i % 2 = 0 THEN 'acct-' || (i % 10000) END "
    "FROM generate_series(1, 200000) i"
)


@pytest.mark.timeout(300)
async def test_the_list_reads_indexes_only_at_ten_thousand_keys(db: asyncpg.Connection) -> None:
    """No sequential scan of ``jobs`` in the list's plan (the first page and one further on)
    and in one key's, under custom and generic plans. Its speed is measured in
    ``bench/scale.py``, not here."""
    await _register(db, "pk_big", partition_by="acct", partition_concurrency=2)
    await _register(db, "pk_other")
    await db.execute("SET session_replication_role = replica")  # no trigger: rows as they are
    for sql in [*partition_keys_sql("pk_big"), HISTORY]:
        await db.execute(sql, timeout=240)
    await db.execute("RESET session_replication_role")
    await db.execute("ANALYZE jobs; ANALYZE partitions")
    first = await store.partition_page(db, "pk_big", after=None, limit=1000)
    assert len(first) == 1000
    assert first[0].key == "acct-1" and first[0].waiting == 10
    middle = (first[-1].since, first[-1].key)
    sql = store.sql
    cases = {
        "first page": ("partition_page", {"job_type": "pk_big", "after_since": None,
                                          "after_key": None, "limit": 101}),
        "a page further": ("partition_page", {"job_type": "pk_big", "after_since": middle[0],
                                              "after_key": middle[1], "limit": 101}),
        "one key": ("partition_get", {"job_type": "pk_big", "key": "acct-5"}),
    }  # fmt: skip
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for mode in ("force_custom_plan", "force_generic_plan"):
        await db.execute(f"SET plan_cache_mode = {mode}")
        for case, (name, values) in cases.items():
            raw = await db.fetchval(f"EXPLAIN (FORMAT JSON) {sql[name]}", *bind(name, values))
            seen[f"{case} ({mode})"] = scans(json.loads(raw))
    await db.execute("RESET plan_cache_mode")
    on_jobs = {case: [s for s in found if s[1] == "jobs"] for case, found in seen.items()}
    assert all(on_jobs.values()), on_jobs  # the plans do read jobs
    seq = {case: found for case, found in on_jobs.items() if any(s[0] == "Seq Scan" for s in found)}
    assert not seq, seq
    used = {s[2] for found in on_jobs.values() for s in found if s[2]}  # a bitmap heap scan: ""
    assert used <= {"jobs_admit_idx", "jobs_admitted_idx"}, seen


async def test_the_operator_sql_of_the_admission_page_runs(db: asyncpg.Connection) -> None:
    """Each statement of docs/admission.md's SQL blocks, on the `make dev` app's types with
    jobs waiting, a key paused: it runs, and the dry admission changes nothing."""
    from examples.app import router as example_router

    blocks = re.findall(r"```sql\n(.*?)```", ADMISSION_DOC, flags=re.S)
    statements = [s.strip() for b in blocks for s in b.split(";\n") if s.strip()]
    statements = [s.rstrip(";") for s in statements if not all(
        line.startswith("--") for line in s.splitlines())]  # fmt: skip
    assert len(statements) >= 4, statements
    await register_router_types(db, example_router)
    for i in range(6):
        await enqueue(db, "sync_account", {"account": f"acct-{i % 3}"})
    await _set(db, "sync_account", "acct-1", paused=True)
    before = await db.fetch("SELECT id, status::text FROM jobs ORDER BY id")
    results = {}
    for sql in statements:
        results[sql.splitlines()[-1]] = await db.fetch(sql)
    assert await db.fetch("SELECT id, status::text FROM jobs ORDER BY id") == before
    assert any(r and r[0][0] == 2 for r in results.values())  # acct-0 and acct-2 admissible
    by_key = next(r for r in results.values() if r and "count" in dict(r[0]))
    assert {(x["partition_key"], x["count"]) for x in by_key} == {
        ("acct-0", 2), ("acct-1", 2), ("acct-2", 2),
    }  # fmt: skip


async def test_an_admission_pass_reads_about_what_its_window_admits(
    db: asyncpg.Connection,
) -> None:
    """A pass of window 10 at 2,000 waiting keys admits 10 jobs; the index scans of ``jobs`` it
    starts are a bounded multiple of that (it reads at most 2 x 10 + 100 keys from where the
    last pass stopped), not of the keys: 346 here; 5,532 when a pass walked every key."""
    await _register(db, "pk_big", partition_by="acct", partition_concurrency=2)
    for sql in partition_keys_sql("pk_big", keys=2000, per_key=3):
        await db.execute(sql)
    await db.execute("UPDATE jobs SET status = 'IN_PROGRESS' WHERE status = 'PENDING'")
    await db.execute("ANALYZE jobs")
    scans_of_jobs = "SELECT idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
    async with db.transaction():
        before = await db.fetchval(scans_of_jobs)
        assert await store.admit(db, "pk_big", 10) == 10
        started = await db.fetchval(scans_of_jobs) - before
    assert started <= 20 * 10 + 200, started
