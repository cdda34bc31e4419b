"""The state model's only door to the store: each operation the system performs on a job, as the
worker, the relay, the sweeper and the API perform it, on one connection pool. When the store's
API changes, this file changes and the model (``state_model.py``) does not."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from conveyor import JobSpec, enqueue_many
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import Attempt, Completion, Failure, for_schema
from conveyor.worker.outcomes import Outcome

from ..faults.checker import AUDIT_SQL

JOB_TYPE = "m"
# what a worker for JOB_TYPE registers: its handler's defaults (max_retries when unset)
HANDLER_DEFAULTS = {JOB_TYPE: {"max_retries": 1}}
VISIBILITY = 30.0


@dataclass(frozen=True)
class Claim:
    """One claimed attempt, as a worker holds it (the fencing token is ``attempt``)."""

    job_id: uuid.UUID
    attempt: int
    retry_count: int
    max_retries: int


@dataclass(frozen=True)
class Row:
    status: str
    attempts: int
    retry_count: int
    max_retries: int | None
    run_at: datetime | None
    lease_expires_at: datetime | None
    cancel_requested: bool


@dataclass(frozen=True)
class Audit:
    seq: int
    job_id: uuid.UUID
    old_status: str | None
    new_status: str
    attempts: int


class StoreOps:
    def __init__(self, pool: Any, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self.sweeper = Sweeper(settings)
        self.sweeper.pool = pool  # one-step duties only: no broker connection needed
        self.store = for_schema(settings.db_schema)

    async def install(self) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(AUDIT_SQL)

    async def reset(self) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute("TRUNCATE jobs, job_outbox, fault_audit RESTART IDENTITY")

    # ------------------------------------------------------------------ the API

    async def submit(self, *, max_retries: int | None, delay: float | None) -> uuid.UUID:
        spec = JobSpec(JOB_TYPE, {}, max_retries=max_retries, delay_seconds=delay)
        async with self.pool.acquire() as conn, conn.transaction():
            [job_id] = await enqueue_many(conn, [spec])
        return job_id

    async def cancel(self, job_id: uuid.UUID) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            return await self.store.job_cancel(conn, job_id)

    async def redrive(self, job_id: uuid.UUID) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            return bool(await self.store.job_redrive(conn, [job_id]))

    # ------------------------------------------------------------------ the worker

    async def claim(self, ids: list[uuid.UUID], worker: str) -> list[Claim]:
        async with self.pool.acquire() as conn:
            rows = await self.store.job_claim_many(
                conn, ids, lease_seconds=VISIBILITY, worker_id=worker, types=[JOB_TYPE],
                handler_defaults=HANDLER_DEFAULTS,
                default_max_retries=self.settings.default_max_retries,
            )  # fmt: skip
        return [Claim(r.id, r.attempts, r.retry_count, r.max_retries) for r in rows]

    async def complete(self, c: Claim, result: Any) -> bool:
        item = Completion(c.job_id, c.attempt, orjson.dumps(result).decode())
        async with self.pool.acquire() as conn, conn.transaction():
            return bool(await self.store.job_complete_many(conn, [item]))

    async def fail(self, c: Claim, outcome: Outcome) -> bool:
        item = Failure(c.job_id, c.attempt, outcome.error, outcome.delay, outcome.consume)
        async with self.pool.acquire() as conn, conn.transaction():
            return bool(await self.store.job_fail_many(conn, [item]))

    async def release(self, c: Claim) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            return bool(await self.store.job_release_many(conn, [Attempt(c.job_id, c.attempt)]))

    async def heartbeat(self, c: Claim) -> bool:
        async with self.pool.acquire() as conn:
            held = await self.store.job_heartbeat_many(
                conn, [Attempt(c.job_id, c.attempt)], lease_seconds=VISIBILITY
            )
        return c.job_id in held.extended

    # ------------------------------------------------------------------ the relay

    async def relay(self) -> list[tuple[uuid.UUID, str]]:
        """Take every outbox row (committed: as if published and confirmed)."""
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await self.store.outbox_take_batch(conn, limit=10_000)
        return [(r.job_id, r.destination) for r in sorted(rows, key=lambda r: r.id)]

    # ------------------------------------------------------------------ the sweeper

    async def recover_leases(self) -> dict[str, int]:
        return await self.sweeper.recover_leases()

    async def promote_due(self) -> int:
        return await self.sweeper.promote_due()

    async def reconcile(self, depth: dict[str, int]) -> int:
        async def queue_depth(job_type: str) -> int:
            return depth.get(job_type, 0)

        # two passes: the first only marks the missing jobs as suspects (see Sweeper.reconcile)
        first = await self.sweeper.reconcile(queue_depth=queue_depth)
        return first + await self.sweeper.reconcile(queue_depth=queue_depth)

    # ------------------------------------------------------------------ time (database clock)

    async def expire_lease(self, job_id: uuid.UUID) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE jobs SET lease_expires_at = now() - interval '1 s'"
                " WHERE id = $1 AND status = 'IN_PROGRESS'",
                job_id,
            )

    async def make_due(self, job_id: uuid.UUID) -> None:
        """The job's ``run_at`` arrives (a schedule or a holding pen's TTL elapses)."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE jobs SET run_at = LEAST(run_at, now() - interval '1 ms') WHERE id = $1",
                job_id,
            )

    async def age_all(self, seconds: float) -> None:
        """Every job's clocks move ``seconds`` into the past (time passes for the reconciler)."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE jobs SET updated_at = updated_at - make_interval(secs => $1),"
                " run_at = run_at - make_interval(secs => $1)",
                seconds,
            )

    async def freshen(self, ids: list[uuid.UUID]) -> None:
        """The jobs were touched just now (published moments ago): fresh, not overdue."""
        async with self.pool.acquire() as conn:
            await conn.execute("UPDATE jobs SET updated_at = now() WHERE id = ANY($1::uuid[])", ids)

    # ------------------------------------------------------------------ observation

    async def now(self) -> datetime:
        """The database's clock (the reconciler's)."""
        async with self.pool.acquire() as conn:
            return await conn.fetchval("SELECT now()")  # type: ignore[no-any-return]

    async def snapshot(self) -> tuple[dict[uuid.UUID, Row], set[uuid.UUID]]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT id, status::text AS status, attempts, retry_count, max_retries, run_at,"
                " lease_expires_at, cancel_requested FROM jobs"
            )
            outbox = await conn.fetch("SELECT DISTINCT job_id FROM job_outbox")
        jobs = {r["id"]: Row(**{k: r[k] for k in Row.__dataclass_fields__}) for r in rows}
        return jobs, {r["job_id"] for r in outbox}

    async def audit_since(self, seq: int) -> list[Audit]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT seq, job_id, old_status, new_status, attempts FROM fault_audit"
                " WHERE seq > $1 ORDER BY seq",
                seq,
            )
        return [Audit(**dict(r)) for r in rows]
