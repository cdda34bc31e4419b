"""What the workflow tests do to jobs, through the store's own statements: claim, complete,
fail, cancel, redrive, as a worker, the API and an operator do."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import orjson

from conveyor.store import Completion, Failure, for_schema

STORE = for_schema()
TYPES = ["a", "b", "c", "t", "x"]


async def claim(db: Any, job_id: uuid.UUID) -> int | None:
    """Claim one job (as a worker does); its attempt, or None when it is not claimable."""
    rows = await STORE.job_claim_many(
        db,
        [job_id],
        lease_seconds=60,
        worker_id="w",
        types=TYPES,
        handler_defaults={},
        default_max_retries=0,
    )
    return rows[0].attempts if rows else None


async def complete(db: Any, job_id: uuid.UUID, result: Any = None) -> None:
    attempt = await claim(db, job_id)
    assert attempt is not None, f"job {job_id} is not claimable"
    done = await STORE.job_complete_many(
        db, [Completion(job_id, attempt, orjson.dumps(result).decode())]
    )
    assert done == {job_id}


async def fail(db: Any, job_id: uuid.UUID, error: str = "boom") -> None:
    attempt = await claim(db, job_id)
    assert attempt is not None, f"job {job_id} is not claimable"
    await STORE.job_fail_many(db, [Failure(job_id, attempt, error, None)])


async def statuses(db: asyncpg.Connection, workflow_id: uuid.UUID) -> dict[str, str]:
    rows = await db.fetch(
        "SELECT workflow_key, status::text FROM jobs WHERE workflow_id = $1", workflow_id
    )
    return {r["workflow_key"]: r["status"] for r in rows}


async def ids(db: asyncpg.Connection, workflow_id: uuid.UUID) -> dict[str, uuid.UUID]:
    rows = await db.fetch("SELECT workflow_key, id FROM jobs WHERE workflow_id = $1", workflow_id)
    return {r["workflow_key"]: r["id"] for r in rows}


async def outboxed(db: asyncpg.Connection, workflow_id: uuid.UUID) -> set[str]:
    rows = await db.fetch(
        "SELECT j.workflow_key FROM job_outbox o JOIN jobs j ON j.id = o.job_id "
        "WHERE j.workflow_id = $1 AND o.destination = 'work'",
        workflow_id,
    )
    return {r["workflow_key"] for r in rows}


async def workflow_status(db: asyncpg.Connection, workflow_id: uuid.UUID) -> str:
    return str(await db.fetchval("SELECT status FROM workflows WHERE id = $1", workflow_id))
