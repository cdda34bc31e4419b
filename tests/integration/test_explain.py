"""Every dashboard, gauge and view query uses an index on a large table: EXPLAIN on a million
generated jobs (and a day of attempts) shows no sequential scan of ``jobs`` or
``job_attempts``. CONVEYOR_EXPLAIN_ROWS sets the size (default 1,000,000)."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import asyncpg
import pytest

from conveyor.store import for_schema

ROWS = int(os.environ.get("CONVEYOR_EXPLAIN_ROWS", "1000000"))
store = for_schema()

GENERATE = """
INSERT INTO jobs (id, job_type, status, priority, payload, attempts, last_error, created_at,
                  updated_at, started_at, finished_at, lease_expires_at)
SELECT gen_random_uuid(), 'type_' || (i % 12),
       (CASE WHEN i % 100 < 94 THEN 'COMPLETED' WHEN i % 100 < 97 THEN 'FAILED'
             WHEN i % 100 < 98 THEN 'PENDING' WHEN i % 100 < 99 THEN 'RETRYING'
             ELSE 'IN_PROGRESS' END)::job_status,
       5, '{}', 1, CASE WHEN i % 100 BETWEEN 94 AND 96 THEN 'ValueError: ' || (i % 7) END,
       t, t, t, CASE WHEN i % 100 < 97 THEN t END,
       CASE WHEN i % 100 = 99 THEN t + interval '30 s' END
FROM generate_series(1, $1) AS i,
     LATERAL (SELECT now() - make_interval(secs => ($1 - i) * 86400.0 / $1)) AS g(t)
"""

ATTEMPTS = """
INSERT INTO job_attempts (job_id, attempt, job_type, worker_id, started_at, finished_at,
                          outcome, error, duration_seconds, wait_seconds)
SELECT id, 1, job_type, 'w', started_at, finished_at,
       CASE WHEN status = 'FAILED' THEN 'failed' ELSE 'completed' END, last_error, 0.01, 0.02
FROM jobs WHERE finished_at IS NOT NULL ORDER BY finished_at
"""


def _scans(plan: Any) -> list[tuple[str, str, str]]:
    found: list[tuple[str, str, str]] = []
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            found.append((plan["Node Type"], plan["Relation Name"], plan.get("Index Name", "")))
        for v in plan.values():
            found += _scans(v)
    elif isinstance(plan, list):
        for v in plan:
            found += _scans(v)
    return found


@pytest.mark.timeout(600)
async def test_no_sequential_scan_on_a_million_jobs(db: asyncpg.Connection) -> None:
    await db.execute(GENERATE, ROWS)
    await db.execute(ATTEMPTS)
    await db.execute("ANALYZE jobs; ANALYZE job_attempts")
    sql = store.sql
    some = uuid.uuid4()
    queries: dict[str, tuple[str, tuple[Any, ...]]] = {
        "backlog view / conveyor_jobs gauge": (sql["job_backlog"], ()),
        "stuck_jobs view": ("SELECT * FROM stuck_jobs", ()),
        "conveyor_leases_expired gauge": (sql["job_stuck_count"], ()),
        "recent_failures view": ("SELECT * FROM recent_failures", ()),
        "throughput view": ("SELECT * FROM throughput", ()),
        "overview: last hour": (sql["job_overview_hour"], ()),
        "jobs page: all": (sql["job_page"], (None, None, None, None, 51)),
        "jobs page: type": (sql["job_page_filtered"], ("type_3", None, None, None, 51)),
        "jobs page: type+status+cursor": (
            sql["job_page_filtered"],
            ("type_3", "FAILED", some, None, 51),
        ),
        "jobs page: status": (sql["job_page_filtered"], (None, "PENDING", None, None, 51)),
        "dead letters by type and error": (sql["job_dead_groups"], ()),
        "dead letters count": (sql["job_dead_count"], ("type_3", "ValueError: 1")),
        "one job": (sql["job_get"], (some,)),
        "one job's attempts": (sql["job_attempt_list"], (some,)),
    }
    report = {}
    # custom plans (the first executions of a prepared statement), then the generic plan
    # PostgreSQL may switch to after five executions
    for mode in ("force_custom_plan", "force_generic_plan"):
        await db.execute(f"SET plan_cache_mode = {mode}")
        for name, (query, args) in queries.items():
            raw = await db.fetchval(f"EXPLAIN (FORMAT JSON) {query}", *args)
            scans = _scans(json.loads(raw))
            report[f"{name} ({mode})"] = scans
            seq = [s for s in scans if s[0] == "Seq Scan" and s[1] in ("jobs", "job_attempts")]
            assert not seq, f"{name} ({mode}): {scans}"
            if "page:" in name and "all" not in name:  # a rare filter must not walk the pkey
                assert {s[2] for s in scans} == {"jobs_type_status_id_idx"}, (name, scans)
    print("\n".join(f"{k}: {sorted(set(v))}" for k, v in report.items()))
