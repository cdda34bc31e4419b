"""The sweeper's statements: promote due jobs, recover expired leases, reconcile lost messages,
delete old finished jobs. Each takes a batch size and locks with ``SKIP LOCKED``, so several
sweepers can run at once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg

from ..core.jobs import PEN_LADDER, Status
from .base import Connection, Statements, affected
from .registry import named
from .rows import JobStatus

JOB_PROMOTE_DUE = named("job_promote_due")
JOB_EXPIRED_IDS = named("job_expired_ids")
JOB_RECOVER_EXPIRED = named("job_recover_expired")
JOB_COUNT_OVERDUE = named("job_count_overdue")
JOB_RECOUNT_OVERDUE = named("job_recount_overdue")
JOB_REPUBLISH_OVERDUE = named("job_republish_overdue")
JOB_OVERDUE_IDS = named("job_overdue_ids")
MAINTENANCE_BOUND = named("maintenance_bound")
JOB_RECONCILE_LOCK = named("job_reconcile_lock")
JOB_DELETE_EXPIRED = named("job_delete_expired")
DUTIES_TRY_LOCK = named("duties_try_lock")
DUTIES_HELD = named("duties_held")
DUTIES_SESSION_BOUND = named("duties_session_bound")
ADMISSION_TYPES = named("admission_types")
ADMIT = named("admit")


class MaintenanceStatements(Statements):
    async def admission_types(self, conn: Connection) -> list[str]:
        """The types with jobs waiting for admission."""
        return [r["name"] for r in await conn.fetch(self.sql[ADMISSION_TYPES])]

    async def admit(
        self, conn: Connection, job_type: str, window: int, *, dry: bool = False
    ) -> int:
        """One admission pass of ``job_type`` (one statement); returns how many it admitted, or
        with ``dry`` how many the limits would admit with no window."""
        return int(await conn.fetchval(self.sql[ADMIT], job_type, window, dry))

    async def job_promote_due(self, conn: Connection, *, limit: int) -> int:
        """SCHEDULED jobs whose ``run_at`` passed (database clock) → PENDING + outbox rows."""
        return int(await conn.fetchval(self.sql[JOB_PROMOTE_DUE], limit))

    async def job_expired_ids(
        self, conn: Connection, *, limit: int, aside: Sequence[uuid.UUID]
    ) -> list[uuid.UUID]:
        """Up to ``limit`` IN_PROGRESS jobs whose lease expired (or that have none), the longest
        expired first, none of ``aside``."""
        rows = await conn.fetch(self.sql[JOB_EXPIRED_IDS], limit, list(aside))
        return [r["id"] for r in rows]

    async def job_recover_expired(
        self, conn: Connection, ids: Sequence[uuid.UUID], *, default_max_retries: int
    ) -> list[JobStatus]:
        """Those of ``ids`` still IN_PROGRESS with an expired lease (or none) → RETRYING
        (through a holding pen, after the default backoff), FAILED or CANCELLED."""
        rows = await conn.fetch(
            self.sql[JOB_RECOVER_EXPIRED], list(ids), default_max_retries, list(PEN_LADDER)
        )
        return [JobStatus(r["id"], Status(r["status"]), r["job_type"]) for r in rows]

    async def job_count_overdue(self, conn: Connection, *, after: float) -> dict[str, int]:
        """Per type, PENDING/RETRYING jobs untouched for ``after`` seconds with no outbox row."""
        rows = await conn.fetch(self.sql[JOB_COUNT_OVERDUE], after)
        return {r["job_type"]: int(r["n"]) for r in rows}

    async def job_recount_overdue(
        self, conn: Connection, job_type: str, *, after: float
    ) -> tuple[int, int]:
        """``job_type``'s overdue jobs and its fresh ones (due, not overdue), no outbox row."""
        r = await conn.fetchrow(self.sql[JOB_RECOUNT_OVERDUE], job_type, after)
        return int(r["overdue"]), int(r["fresh"])

    async def job_republish_overdue(
        self,
        conn: Connection,
        job_type: str,
        *,
        after: float,
        limit: int,
        among: Sequence[uuid.UUID],
    ) -> int:
        """Give up to ``limit`` of the jobs ``among`` that are still overdue a new outbox row."""
        return int(
            await conn.fetchval(
                self.sql[JOB_REPUBLISH_OVERDUE], job_type, after, limit, list(among)
            )
        )

    async def job_overdue_ids(
        self, conn: Connection, job_type: str, *, after: float, limit: int
    ) -> list[uuid.UUID]:
        """The ``limit`` oldest overdue jobs of ``job_type`` (no outbox row, untouched)."""
        rows = await conn.fetch(self.sql[JOB_OVERDUE_IDS], job_type, after, limit)
        return [r["id"] for r in rows]

    async def maintenance_bound(
        self, conn: Connection, *, idle: float, lock_wait: float
    ) -> datetime:
        """First in a duty's transaction: the session ends after ``idle`` seconds idle inside
        it, a lock wait fails after ``lock_wait`` seconds (see ``MAINTENANCE_BOUND``). Returns
        the database's clock."""
        value: datetime = await conn.fetchval(
            self.sql[MAINTENANCE_BOUND], f"{round(idle * 1000)}ms", f"{round(lock_wait * 1000)}ms"
        )
        return value

    async def job_reconcile_lock(self, conn: Connection, job_type: str) -> bool:
        """Take ``job_type``'s reconcile lock until the transaction ends; False when another
        replica holds it (it is reconciling that type right now)."""
        return bool(await conn.fetchval(self.sql[JOB_RECONCILE_LOCK], job_type))

    async def job_delete_expired(
        self, conn: Connection, *, older_than: float, failed_older_than: float, limit: int
    ) -> int:
        """Delete up to ``limit`` COMPLETED/CANCELLED jobs finished more than ``older_than``
        seconds ago and FAILED jobs finished more than ``failed_older_than`` seconds ago."""
        return affected(
            await conn.execute(self.sql[JOB_DELETE_EXPIRED], older_than, failed_older_than, limit)
        )

    async def duties_try_lock(self, conn: Connection) -> bool:
        """Take the duties' lock for this session; False when another session holds it."""
        return bool(await conn.fetchval(self.sql[DUTIES_TRY_LOCK]))

    async def duties_held(self, conn: Connection) -> bool:
        """Does this session hold the duties' lock?"""
        return bool(await conn.fetchval(self.sql[DUTIES_HELD]))

    async def duties_session_bound(self, conn: Connection, *, idle: float) -> bool:
        """End this session after ``idle`` seconds without a statement; False on a server
        without ``idle_session_timeout`` (before PostgreSQL 14)."""
        try:
            await conn.fetchval(self.sql[DUTIES_SESSION_BOUND], f"{round(idle * 1000)}ms")
        except asyncpg.exceptions.UndefinedObjectError:
            return False
        return True
