"""EXPLAIN every statement of the store on a large generated table (``test_explain.py``, and
``bench/scale.py`` at 10 million rows): the jobs, their attempts, an outbox backlog, and the
arguments each statement is run with.

``statement_cases`` takes every statement in ``registry.TEMPLATES`` (a new statement is covered
without anyone listing it) with arguments made from its parameter types, plus the API's and
the dashboard's filter combinations and the operator views. ``violations`` names the sequential
scans of a big table in a plan."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from conveyor.store import for_schema
from conveyor.store.registry import PARAMS, TEMPLATES, bind
from conveyor.store.workflow_pages import page_statement

# Ids are UUIDv7-shaped (creation time first), as Conveyor's are: inserts append to the primary
# key like production's, and the time filter of GET /jobs (an id range) means what it says.
# The mix of a busy install: mostly finished jobs, a few percent FAILED, a live backlog
# (PENDING, RETRYING due later, IN_PROGRESS with leases ahead, SCHEDULED in the future), over the
# last ``$2`` days, 12 types. Nothing is overdue, nothing expired: the sweeper's passes are idle.
GENERATE = """
INSERT INTO jobs (id, job_type, status, priority, payload, attempts, last_error, created_at,
                  updated_at, started_at, finished_at, lease_expires_at, run_at, workflow_id,
                  workflow_key, deps_pending)
SELECT (stamp || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
       'type_' || (i % 12),
       CASE WHEN WAITING_CHILD THEN 'WAITING'::job_status ELSE
       (CASE WHEN i % 100 < 94 THEN 'COMPLETED' WHEN i % 100 < 96 THEN 'FAILED'
             WHEN i % 100 = 96 THEN 'SCHEDULED'
             WHEN i % 100 = 97 THEN 'PENDING' WHEN i % 100 = 98 THEN 'RETRYING'
             ELSE 'IN_PROGRESS' END)::job_status END,
       5, '{}', 1, CASE WHEN i % 100 IN (94, 95, 98) THEN 'ValueError: ' || (i % 7) END,
       t, CASE WHEN i % 100 >= 96 THEN now() ELSE t END, t,
       CASE WHEN i % 100 < 96 THEN t END,
       CASE WHEN i % 100 = 99 THEN now() + interval '1 hour' END,
       CASE WHEN i % 100 IN (96, 98) THEN now() + interval '1 hour' END,
       CASE WHEN b.member THEN (wstamp || '7' || substr(wh, 1, 3) || '8' || substr(wh, 4, 15))::uuid
       END,
       CASE WHEN b.member THEN 'k' || b.k END,
       CASE WHEN b.member THEN (CASE WHEN WAITING_CHILD THEN 1 ELSE 0 END) END
-- Each level computes its values once per row and the next reads them (OFFSET 0 keeps the
-- planner from folding a level into the next, which would compute an expression again at each
-- use: the time five times a row, the hash twice).
FROM (SELECT *, md5(i::text) AS h, lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0')
             AS stamp,
             CASE WHEN member THEN md5('w' || first) END AS wh,
             CASE WHEN member THEN lpad(to_hex((extract(epoch FROM t0) * 1000)::bigint), 12, '0')
             END AS wstamp
      FROM (SELECT i, $4::timestamptz - make_interval(secs => ($1 - i) * 86400.0 * $2 / $1) AS t,
                   -- workflows: blocks of WORKFLOW_JOBS consecutive jobs, one block in every $3
                   -- (0: none)
                   $3 > 0 AND ((i - 1) / WORKFLOW_JOBS) % greatest($3, 1) = 0 AS member,
                   (i - 1) % WORKFLOW_JOBS AS k,
                   (i - 1) / WORKFLOW_JOBS * WORKFLOW_JOBS + 1 AS first
            FROM generate_series(1, $1) AS i OFFSET 0) AS g,
           LATERAL (SELECT $4::timestamptz
                           - make_interval(secs => ($1 - g.first) * 86400.0 * $2 / $1)) AS g0(t0)
      OFFSET 0) AS b
"""


# Workflows of 10 jobs: the last (``k9``) waits for the other nine (a fan-in). Those of the last
# 1 % of the range run: their ``k9`` is WAITING (a quiet install has none: nothing waits).
WORKFLOW_JOBS = 10
WAITING_CHILD = "(b.member AND b.k = WORKFLOW_JOBS - 1 AND i > $1 - $1 / 100)"


# The workflows' rows computed from the same formulas as the jobs' ids (``$4``: the generation's
# clock), block by block: no scan of the million jobs. ``f``: the first job of a workflow's
# block.
def _time(i: str) -> str:
    return f"($4::timestamptz - make_interval(secs => ($1 - ({i})) * 86400.0 * $2 / $1))"


def _job_id(i: str, seed: str) -> str:
    epoch_ms = f"(extract(epoch FROM {_time(i)}) * 1000)::bigint"
    return (
        f"(lpad(to_hex({epoch_ms}), 12, '0') || '7' || substr(md5({seed}), 1, 3) || '8' "
        f"|| substr(md5({seed}), 4, 15))::uuid"
    )


BLOCKS = "generate_series(1, $1 - WORKFLOW_JOBS + 1, WORKFLOW_JOBS * $3) AS f"
RUNNING = "f + WORKFLOW_JOBS - 1 > $1 - $1 / 100"  # its last job is a WAITING child
WORKFLOWS = f"""
INSERT INTO workflows (id, name, status, created_at, finished_at)
SELECT {_job_id("f", "'w' || f")}, 'wf_' || (f / WORKFLOW_JOBS % 20),
       CASE WHEN {RUNNING} THEN 'RUNNING' WHEN f / WORKFLOW_JOBS % 7 = 3 THEN 'FAILED'
            ELSE 'COMPLETED' END,
       {_time("f")}, CASE WHEN NOT ({RUNNING}) THEN {_time("f + WORKFLOW_JOBS - 1")} END
FROM {BLOCKS}
"""

# Each workflow's last job (its highest key) depends on the others: one pass over the
# workflow jobs, sorted by workflow (cheaper than computing each edge's ids again).
DEPENDENCIES = """
INSERT INTO job_dependencies (job_id, depends_on)
SELECT child, id FROM (
    SELECT id, id = first_value(id) OVER w AS last, first_value(id) OVER w AS child
    FROM jobs WHERE workflow_id IS NOT NULL
    WINDOW w AS (PARTITION BY workflow_id ORDER BY substr(workflow_key, 2)::int DESC)
) x
WHERE NOT last
"""


def generate_sql(quiet: bool) -> str:
    sql = GENERATE.replace("WAITING_CHILD", "false" if quiet else WAITING_CHILD)
    sql = sql.replace("WORKFLOW_JOBS", str(WORKFLOW_JOBS))
    return quiet_mix(sql) if quiet else sql


def quiet_mix(generate: str) -> str:
    start = generate.index("(CASE WHEN i % 100 < 94")
    end = generate.index("::job_status", start) + len("::job_status")
    return generate[:start] + QUIET_STATUSES + generate[end:]


ATTEMPTS = """
INSERT INTO job_attempts (job_id, attempt, job_type, worker_id, started_at, finished_at,
                          outcome, error, duration_seconds, wait_seconds)
SELECT id, 1, job_type, 'w', started_at, finished_at,
       CASE WHEN status = 'FAILED' THEN 'failed' ELSE 'completed' END, last_error, 0.01, 0.02
FROM jobs WHERE finished_at IS NOT NULL ORDER BY finished_at
"""

# The outbox of the PENDING jobs (a relay that fell behind: the outbox is big too).
OUTBOX = """
INSERT INTO job_outbox (job_id, job_type, priority)
SELECT id, job_type, priority FROM jobs WHERE status = 'PENDING'
"""


# A quiet install's mix, as ANALYZE may find it at night: nothing waits or runs, the statistics
# know only finished and SCHEDULED jobs (four statuses), so a statement about PENDING or running
# jobs is planned from a guess. The generic plan of a count stopped by ``LIMIT`` can then take
# the guess for millions of matching rows and scan the whole table.
QUIET_STATUSES = """(CASE WHEN i % 100 < 94 THEN 'COMPLETED' WHEN i % 100 < 96 THEN 'FAILED'
             WHEN i % 100 = 96 THEN 'CANCELLED' ELSE 'SCHEDULED' END)::job_status"""


async def generate(
    conn: asyncpg.Connection,
    rows: int,
    days: float = 30,
    *,
    quiet: bool = False,
    workflow_every: int = 0,
) -> None:
    """``rows`` jobs over ``days``, their attempts, the outbox of the PENDING ones, fresh
    statistics (``quiet``: the mix of ``QUIET_STATUSES`` instead, nothing PENDING, and
    vacuumed as autovacuum would have by then). ``workflow_every``: one block of
    ``WORKFLOW_JOBS`` jobs in every that many is a workflow (a fan-in), with its row and its
    dependency edges (0: no workflow). The secondary indexes of ``jobs`` are dropped first and
    built again after (as they were): one sort each instead of millions of random index
    insertions."""
    indexes = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
        " AND tablename = 'jobs' AND indexname <> 'jobs_pkey'"
    )
    await conn.execute("SET maintenance_work_mem = '256MB'")
    for r in indexes:
        await conn.execute(f"DROP INDEX {r['indexname']}")
    clock = await conn.fetchval("SELECT now()")
    await conn.execute(generate_sql(quiet), rows, days, workflow_every, clock, timeout=7200)
    for r in indexes:
        await conn.execute(r["indexdef"], timeout=7200)
    if workflow_every:
        workflows = WORKFLOWS.replace("WORKFLOW_JOBS", str(WORKFLOW_JOBS))
        await conn.execute(workflows, rows, days, workflow_every, clock, timeout=7200)
        await conn.execute(DEPENDENCIES, timeout=7200)
    await conn.execute(ATTEMPTS, timeout=7200)
    await conn.execute(OUTBOX, timeout=7200)
    if quiet:  # a quiet install: autovacuum has been through, the visibility map is set
        for table in BIG:
            await conn.execute(f"VACUUM ANALYZE {table}", timeout=7200)
    else:  # a fresh bulk load: statistics, no vacuum yet
        await conn.execute("; ".join(f"ANALYZE {table}" for table in BIG), timeout=7200)


def partition_keys_sql(job_type: str, keys: int = 10_000, per_key: int = 10) -> list[str]:
    """A partitioned type's backlog (GET /types/{type}/partitions at scale: ``test_partitions.py``
    and ``bench/scale.py``): ``keys`` keys ``acct-<n>`` of ``per_key`` WAITING jobs each, their
    submits spread over the last ``keys * per_key / 100`` seconds; one key in five with an
    admitted and a running job; 100 operator overrides. The type's row must exist."""
    waiting = keys * per_key
    return [
        "INSERT INTO jobs (id, job_type, status, priority, payload, created_at, partition_key) "
        f"SELECT gen_random_uuid(), '{job_type}', 'WAITING', 5, '{{}}', "
        f"  now() - make_interval(secs => ({waiting} - i) * 0.01), 'acct-' || (i % {keys}) "
        f"FROM generate_series(1, {waiting}) i",
        "INSERT INTO jobs (id, job_type, status, priority, payload, started_at, partition_key) "
        f"SELECT gen_random_uuid(), '{job_type}', s::job_status, 5, '{{}}', "
        "  CASE WHEN s = 'IN_PROGRESS' THEN now() END, 'acct-' || (i * 5) "
        f"FROM generate_series(0, {keys // 5 - 1}) i, unnest(ARRAY['PENDING', 'IN_PROGRESS']) s",
        "INSERT INTO partitions (job_type, key, concurrency, paused) "
        f"SELECT '{job_type}', 'acct-' || (i * 7), 3, i % 2 = 0 FROM generate_series(1, 100) i",
    ]


BIG = ("jobs", "job_attempts", "job_outbox", "workflows", "job_dependencies")
LOOKUP = re.compile(r"\((\w+\.)?id = (ANY )?\(?[$\w.]+\)?\)")
# The outbox is small by design (the relay drains it); these read all of it on purpose: the
# reconciler's anti-join "no outbox row for this job" (hashing the outbox once per pass costs
# less than an index on ``job_outbox.job_id`` would cost every submit and every publish) and the
# outbox gauge's count.
OUTBOX_READERS = {
    "job_count_overdue", "job_recount_overdue", "job_overdue_ids", "job_republish_overdue",
    "outbox_stats",
}  # fmt: skip
# The gauges' count of workflows by status stops each status at the cap, and for the status
# most of the table is in (COMPLETED: finished workflows stay until retention) the planner
# rightly takes a sequential scan that ends after the cap's rows; what it reads in all is
# bounded in ``test_gauge_cost.py``.
CAPPED_SCANS = {"workflow_status_counts": "workflows"}

# Arguments by parameter type: one plausible value each (a type of the data, a limit of 500,
# an age of seven days, ids that exist nowhere).
SOME_ID = uuid.UUID("018f0000-0000-7000-8000-000000000000")  # older than every row
# A page cursor in the middle of the data (a UUIDv7 of 15 days ago): "the next page" of a
# listing, whose id range covers half the table.
MID_CURSOR = uuid.UUID(int=(int((dt.datetime.now(dt.UTC).timestamp() - 15 * 86400) * 1000) << 80))
_BY_TYPE: dict[str, Any] = {
    "uuid": SOME_ID,
    "uuid[]": [SOME_ID, uuid.uuid4()],
    "text": "type_3",
    "text[]": ["type_3"],
    "int2": 5,
    "int2[]": [5],
    "int4": 500,
    "int4[]": [1],
    "int8": 500,
    "int8[]": [1],
    "float8": 7 * 86400.0,
    "float8[]": [None],
    "bool": False,
    "bool[]": [True],
    "jsonb": "{}",
    "timestamptz[]": [None],
    "timestamptz": dt.datetime.now(dt.UTC),
    "bytea": b"\x00" * 32,
    "float4": 1.0,
    "jsonb[]": ["{}"],
    "bpchar": "x",
    "varchar": "x",
    "interval": dt.timedelta(seconds=60),
    "_text": ["type_3"],
}

# Statements whose arguments the defaults above would make implausible.
_OVERRIDES: dict[str, tuple[Any, ...] | dict[str, Any]] = {
    "job_count_overdue": (60.0,),
    "job_overdue_ids": ("type_3", 60.0, 500),
    "job_recount_overdue": ("type_3", 60.0),
    "job_republish_overdue": ("type_3", 60.0, 500, [SOME_ID]),
    "job_delete_expired": (7 * 86400.0, 30 * 86400.0, 500),
    "job_insert": {
        "id": [uuid.uuid4()],
        "job_type": ["type_3"],
        "payload": ["{}"],
        "priority": [5],
        "max_retries": [None],
        "timeout_seconds": [None],
        "run_at": [None],
        "delay": [None],
        "idempotency_key": ["k"],
        "request_hash": ["h"],
        "meta": [None],
        "unique_key": ["type_3/key/k"],
        "unique_for": [60.0],
        "among": [],
        "trace_context": None,
        "partition_key": [None],
    },
    "outbox_restore": {
        "id": [1],
        "job_id": [SOME_ID],
        "job_type": ["type_3"],
        "priority": [5],
        "destination": ["work"],
        "delay_seconds": [None],
        "error": [None],
        "attempt": [None],
    },
    "job_type_register_many": {
        "name": ["type_3"],
        "max_retries": [3],
        "timeout_seconds": [None],
        "retry_delays": [""],
        "concurrency": [None],
        "rate_limit": [None],
        "rate_period": [None],
        "partition_by": [None],
        "partition_concurrency": [None],
        "partition_rate_limit": [None],
        "partition_rate_period": [None],
        "ordered": [None],
    },
    "job_dead_count": ("type_3", "ValueError: 1"),
    "job_page": {"job_type": None, "status": None, "before": None, "since": None, "limit": 51},
    "job_page_filtered": {
        "job_type": "type_3",
        "status": "FAILED",
        "before": None,
        "since": None,
        "limit": 51,
    },
    "job_redrive_dead": ("type_3", "ValueError: 1", 500),
    "job_purge_dead": ("type_3", "ValueError: 1", 500),
    "admit": ("type_3", 200, False),
    "job_debounce": {
        "id": SOME_ID,
        "job_type": "type_3",
        "payload": "{}",
        "priority": 5,
        "max_retries": None,
        "timeout_seconds": None,
        "meta": None,
        "partition_key": None,
        "idempotency_key": None,
        "request_hash": None,
        "trace_context": None,
        "debounce_seconds": 1.0,
        "debounce_max": 10.0,
        "debounce_key": "k",
        "wait_bound": "2s",
    },
    "job_fail_many": {
        "job_id": [SOME_ID],
        "attempt": [1],
        "error": ["x"],
        "delay": [5],
        "consume": [True],
    },
}

# Statements that read only catalogs or no table at all (``job_count_estimate`` and
# ``workflow_count_estimate`` are EXPLAINs: they plan, they read no row).
_SKIP = {"database_exists", "db_ping", "job_count_estimate", "workflow_count_estimate",
         "role_find", "role_login_sql", "role_jit_off_sql", "role_set_sql"}  # fmt: skip
# ``conveyor.testing``'s statements run only in applications' test suites, on a handful of rows
# (``tests/integration/test_testing_kit.py`` runs every one of them)
_TEST_ONLY = "testing_"


async def statement_cases(
    conn: asyncpg.Connection, schema: str = "conveyor"
) -> dict[str, tuple[str, tuple[Any, ...]]]:
    sql = for_schema(schema).sql
    cases: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for name in sorted(TEMPLATES):
        if name in _SKIP or name.startswith(_TEST_ONLY):
            continue
        if name in _OVERRIDES:
            args = _OVERRIDES[name]
            # a statement with named parameters takes them by name (``registry.bind``)
            cases[name] = (sql[name], tuple(bind(name, args) if isinstance(args, dict) else args))
            continue
        params = (await conn.prepare(sql[name])).get_parameters()
        cases[name] = (sql[name], tuple(_BY_TYPE[p.name] for p in params))
    # GET /jobs and the dashboard's jobs page: every combination of type, status, cursor and
    # time window (a UUIDv7 lower bound), each status alone (SCHEDULED without a type was a
    # sequential scan), the operator views
    hour_ago = uuid.UUID(int=(int((dt.datetime.now(dt.UTC).timestamp() - 3600) * 1000) << 80))
    for t in (None, "type_3"):
        for st in (None, "FAILED", "SCHEDULED", "PENDING", "COMPLETED"):
            for cursor in (None, MID_CURSOR):
                for since in (None, hour_ago):
                    q = "job_page" if t is None and st is None else "job_page_filtered"
                    values = {"job_type": t, "status": st, "before": cursor, "since": since,
                              "limit": 51}  # fmt: skip
                    cases[f"GET /jobs type={t} status={st} cursor={cursor} since={since}"] = (
                        sql[q], tuple(bind(q, values))
                    )  # fmt: skip
    for view in ("backlog", "stuck_jobs", "recent_failures", "throughput"):
        cases[f"view {view}"] = (f"SELECT * FROM {schema}.{view}", ())
    cases.update(await workflow_cases(conn, schema))
    return cases


async def workflow_cases(
    conn: asyncpg.Connection, schema: str = "conveyor"
) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """GET /workflows (every combination of status, name and cursor), GET /workflows/{id} and a
    claimed job's parents on a workflow in the middle of the data, the workflow views."""
    sql = for_schema(schema).sql
    mid = await conn.fetchval(
        f"SELECT id FROM {schema}.workflows WHERE id < $1 ORDER BY id DESC LIMIT 1", MID_CURSOR
    )
    wf = mid or SOME_ID
    cases: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for st in (None, "RUNNING", "COMPLETED", "FAILED", "CANCELLED"):
        for name in (None, "wf_3"):
            for cursor in (None, mid):
                q = page_statement(st, name)
                values = {"status": st, "name": name, "before": cursor, "limit": 51}
                values = {k: v for k, v in values.items() if k in PARAMS[q]}
                cases[f"GET /workflows status={st} name={name} cursor={cursor}"] = (
                    sql[q], tuple(bind(q, values))
                )  # fmt: skip
    cases["GET /workflows/{id} workflow_get"] = (sql["workflow_get"], (wf,))
    cases["GET /workflows/{id} workflow_jobs"] = (sql["workflow_jobs"], (wf,))
    children = await conn.fetchval(
        f"SELECT array_agg(id) FROM {schema}.jobs WHERE workflow_id = $1", wf
    )
    cases["workflow_parents of a workflow's jobs"] = (sql["workflow_parents"], (children or [],))
    for view in ("running_workflows", "blocked_jobs"):
        cases[f"view {view}"] = (f"SELECT * FROM {schema}.{view}", ())
    cases["view workflow_counts of one"] = (
        f"SELECT * FROM {schema}.workflow_counts WHERE workflow_id = $1",
        (wf,),
    )
    return cases


async def big_tables(conn: asyncpg.Connection, schema: str) -> tuple[str, ...]:
    """The tables of ``BIG`` the statistics know rows of: a run generated without workflows
    (``bench/scale.py``) leaves theirs empty, and reading an empty table costs nothing."""
    rows = await conn.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace "
        "AND relname = ANY($2::text[]) AND reltuples > 1000",
        schema, list(BIG),
    )  # fmt: skip
    return tuple(r["relname"] for r in rows)


def scans(plan: Any) -> list[tuple[str, str, str]]:
    """(node type, relation, index) of every scan in a JSON plan; a primary-key scan that only
    looks up given ids (``id = …``, ``id = ANY (…)``) is named ``jobs_pkey (lookup)``."""
    found: list[tuple[str, str, str]] = []
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            index = plan.get("Index Name", "")
            if index.endswith("_pkey") and LOOKUP.fullmatch(plan.get("Index Cond", "")):
                index += " (lookup)"
            found.append((plan["Node Type"], plan["Relation Name"], index))
        for v in plan.values():
            found += scans(v)
    elif isinstance(plan, list):
        for v in plan:
            found += scans(v)
    return found


async def explain_all(
    conn: asyncpg.Connection, schema: str = "conveyor", *, empty_outbox: bool = False
) -> tuple[dict[str, list[tuple[str, str, str]]], list[str]]:
    """Every case under custom plans (a prepared statement's first executions, and every
    execution through PgBouncer, where statements are unnamed) and under the generic plan
    PostgreSQL may switch to from the sixth. Returns the scans per case and the violations.
    ``empty_outbox``: the outbox is empty (nothing PENDING), so reading all of it is right."""
    report: dict[str, list[tuple[str, str, str]]] = {}
    bad: list[str] = []
    cases = await statement_cases(conn, schema)
    big = await big_tables(conn, schema)
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for name, (query, args) in cases.items():
            try:
                raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}", *args)
            except asyncpg.PostgresError as exc:
                raise AssertionError(f"{name}: {exc}") from exc
            found = scans(json.loads(raw))
            report[f"{name} ({mode})"] = found
            allowed = ("job_outbox",) if name in OUTBOX_READERS or empty_outbox else ()
            allowed += (CAPPED_SCANS[name],) if name in CAPPED_SCANS else ()
            seq = [s for s in found if s[0] == "Seq Scan" and s[1] in big and s[1] not in allowed]
            if seq:
                bad.append(f"{name} ({mode}): {found}")
                continue
            # a filter reads (type, status) ranges, never the whole primary key (a time window
            # may read its own id range of it)
            indexes = {s[2] for s in found if s[1] == "jobs"}
            filtered = name.startswith("GET /jobs") and "type=None status=None" not in name
            allowed = {"jobs_type_status_id_idx", "jobs_pkey (lookup)"} | (
                {"jobs_pkey"} if "since=None" not in name else set()
            )
            if filtered and not indexes <= allowed:
                bad.append(f"{name} ({mode}) walks another index: {found}")
    await conn.execute("RESET plan_cache_mode")
    return report, bad


# The workflow triggers' own statements (migration 0016 and any later one that replaces them),
# as they run: auto_explain sends each nested statement's plan to this session as a NOTICE while
# a transaction, rolled back after, drives a running workflow through every path. ``parents``:
# the dependencies of the workflow's waiting child; ``first_parent``: one of them.
TRIGGER_PATHS = {
    # a parent completes, then all of them in one statement: the child counted down, released
    "release": """
        UPDATE {s}.jobs SET status = 'COMPLETED' WHERE id = (TABLE first_parent);
        UPDATE {s}.jobs SET status = 'COMPLETED' WHERE id = ANY(ARRAY(SELECT id FROM parents))""",
    # a parent fails (on_failure cancel: the waiting child is cancelled), then it is retried
    # (the child waits again) and a redrive meets the BEFORE trigger
    "fail and retry": """
        UPDATE {s}.jobs SET status = 'FAILED' WHERE id = (TABLE first_parent);
        SELECT {s}.retry_job((TABLE first_parent))""",
    "cancel_workflow": "SELECT {s}.cancel_workflow((SELECT workflow_id FROM parents LIMIT 1))",
}


async def explain_triggers(
    conn: asyncpg.Connection, schema: str = "conveyor"
) -> tuple[dict[str, list[tuple[str, str, str]]], list[str]]:
    """Each path of ``TRIGGER_PATHS`` on the newest running workflow, under custom and generic
    plans: the scans of every statement the triggers and functions ran, and the sequential
    scans of a big table among them."""
    plans: list[Any] = []

    def notice(_: Any, message: Any) -> None:
        text = str(getattr(message, "message", ""))
        if "plan:" in text and "{" in text:
            plans.append(json.loads(text[text.index("{") :]))

    wf = await conn.fetchval(
        f"SELECT id FROM {schema}.workflows WHERE status = 'RUNNING' ORDER BY id DESC LIMIT 1"
    )
    assert wf is not None, "no running workflow in the generated data"
    setup = (
        f"CREATE TEMP TABLE parents ON COMMIT DROP AS SELECT j.id, j.workflow_id "
        f"FROM {schema}.jobs c JOIN {schema}.job_dependencies d ON d.job_id = c.id "
        f"JOIN {schema}.jobs j ON j.id = d.depends_on "
        f"WHERE c.workflow_id = '{wf}' AND c.status = 'WAITING'; "
        "CREATE TEMP TABLE first_parent ON COMMIT DROP AS "
        "SELECT id FROM parents ORDER BY id LIMIT 1; "
        # the parents running (most generated ones are finished), the triggers off meanwhile
        "SET LOCAL session_replication_role = replica; "
        f"UPDATE {schema}.jobs SET status = 'IN_PROGRESS', finished_at = NULL "
        "WHERE id = ANY(ARRAY(SELECT id FROM parents)); "
        f"UPDATE {schema}.jobs SET deps_pending = (SELECT count(*) FROM parents) "
        f"WHERE workflow_id = '{wf}' AND status = 'WAITING'; "
        "SET LOCAL session_replication_role = origin"
    )
    report: dict[str, list[tuple[str, str, str]]] = {}
    bad: list[str] = []
    await conn.execute(
        "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; "
        "SET auto_explain.log_nested_statements = on; SET auto_explain.log_format = json; "
        "SET auto_explain.log_level = notice"
    )
    conn.add_log_listener(notice)
    try:
        for mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            for path, body in TRIGGER_PATHS.items():
                tr = conn.transaction()
                await tr.start()
                try:
                    await conn.execute(setup)
                    plans.clear()
                    for statement in body.format(s=schema).split(";"):
                        await conn.execute(statement)
                finally:
                    await tr.rollback()
                for plan in plans:
                    query = " ".join(str(plan.get("Query Text", "")).split())[:160]
                    found = scans(plan.get("Plan", {}))
                    report[f"trigger {path}: {query} ({mode})"] = found
                    # retry_job, the operator's redrive of one job, tests for its outbox row
                    # as the OUTBOX_READERS do: the outbox is small by design
                    allowed = ("job_outbox",) if "job_outbox o WHERE o.job_id" in query else ()
                    seq = [x for x in found if x[0] == "Seq Scan" and x[1] in BIG
                           and x[1] not in allowed]  # fmt: skip
                    if seq:
                        bad.append(f"trigger {path} ({mode}): {query}: {found}")
    finally:
        conn.remove_log_listener(notice)
        await conn.execute("RESET plan_cache_mode; RESET auto_explain.log_level")
    # the notices arrived, the release's and the cancel cascade's among them
    texts = " ".join(report)
    assert "INSERT INTO" in texts and "job_outbox" in texts, texts
    assert "WITH RECURSIVE down" in texts, texts  # the cascade's walk downstream
    return report, bad


# ---------------------------------------------------------------------- plans a session keeps

_JOBS_SCANS = "SELECT seq_scan, seq_tup_read FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"


async def jobs_read_whole(
    conn: asyncpg.Connection, step: Callable[[], Awaitable[object]]
) -> tuple[int, int]:
    """Sequential scans of ``jobs``, and the rows they read, while ``step`` runs on ``conn``
    (in a transaction of its own: the counters are the transaction's, statements run by
    triggers and functions included)."""
    async with conn.transaction():
        before = await conn.fetchrow(_JOBS_SCANS)
        await step()
        after = await conn.fetchrow(_JOBS_SCANS)
    return after["seq_scan"] - before["seq_scan"], after["seq_tup_read"] - before["seq_tup_read"]


async def keep_jobs_unanalyzed(db: asyncpg.Connection) -> None:
    """No ANALYZE of ``jobs`` in this (the test's own) database: the statistics stay a fresh
    install's, whatever the test inserts."""
    await db.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")


async def jobs_never_analyzed(db: asyncpg.Connection) -> bool:
    return not await db.fetchval(
        "SELECT bool_or(last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)"
        " FROM pg_stat_user_tables WHERE relname = 'jobs'"
    )
