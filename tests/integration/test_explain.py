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

from .plans import explain_all, generate

ROWS = int(os.environ.get("CONVEYOR_EXPLAIN_ROWS", "1000000"))


@pytest.mark.timeout(600)
async def test_no_sequential_scan_on_a_million_jobs(db: asyncpg.Connection) -> None:
    await generate(db, ROWS)
    report, bad = await explain_all(db)
    assert len(report) > 2 * 75  # every statement, filter and view, in both plan modes
    assert not bad, "\n".join(bad)
    print("\n".join(f"{k}: {sorted(set(v))}" for k, v in report.items()))
