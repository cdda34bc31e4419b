"""Every statement the services run (all of ``registry.TEMPLATES``), every operator view and
every GET /jobs / dashboard filter (type, status, cursor, time window) uses an index on a large
table: EXPLAIN on a million generated jobs (their attempts, an outbox backlog) shows no
sequential scan of ``jobs``, ``job_attempts`` or ``job_outbox`` (see ``plans.py`` for the few
outbox readers), under custom and generic plans. CONVEYOR_EXPLAIN_ROWS sets the size (default
1,000,000); ``bench/scale.py`` runs the same check at 10 million."""

from __future__ import annotations

import os

import asyncpg
import pytest

from .plans import explain_all, explain_triggers, generate

ROWS = int(os.environ.get("CONVEYOR_EXPLAIN_ROWS", "1000000"))


@pytest.mark.timeout(600)
async def test_no_sequential_scan_on_a_million_jobs(db: asyncpg.Connection) -> None:
    """A fifth of the jobs in workflows (fan-ins of ten), the newest ones running: GET
    /workflows with its filters and cursor, GET /workflows/{id}, the workflow views and the
    statements the workflow triggers run (a release, a failure and its retry, a cancel) read
    indexes too."""
    await generate(db, ROWS, workflow_every=5)
    report, bad = await explain_all(db)
    assert len(report) > 2 * 75  # every statement, filter and view, in both plan modes
    triggers, bad_triggers = await explain_triggers(db)
    report |= triggers
    bad += bad_triggers
    assert not bad, "\n".join(bad)
    print("\n".join(f"{k}: {sorted(set(v))}" for k, v in report.items()))


@pytest.mark.timeout(600)
async def test_no_sequential_scan_when_the_statistics_saw_no_backlog(
    db: asyncpg.Connection,
) -> None:
    """The same, with statistics taken while nothing waited or ran (``plans.QUIET_STATUSES``):
    the planner guesses the rows of PENDING, RETRYING and IN_PROGRESS. The gauges' capped
    count must not take a sequential scan here under its generic plan: at 10 million rows that
    costs seconds a refresh, beside every other statement of the database."""
    await generate(db, ROWS, quiet=True, workflow_every=5)
    statuses = await db.fetchval("SELECT count(DISTINCT status) FROM jobs")
    assert statuses == 4
    assert not await db.fetchval("SELECT count(*) FROM job_outbox")
    report, bad = await explain_all(db, empty_outbox=True)
    assert len(report) > 2 * 75
    assert not bad, "\n".join(bad)
