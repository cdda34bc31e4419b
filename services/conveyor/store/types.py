"""Job types: the ones workers (or a deploy step) registered, with their handlers' defaults,
and their controls (pause, fleet-wide limits; the claim enforces them, ``attempts.py``). The API
and ``enqueue()`` accept only these types (see ``conveyor.jobs.types``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.limits import Partitioning
from .base import Connection, Statements
from .registry import bind, named
from .rows import JobType, JobTypeDefaults, TypeControl

JOB_TYPE_REGISTER_MANY = named("job_type_register_many")
JOB_TYPE_NAMES = named("job_type_names")
JOB_TYPE_LIST = named("job_type_list")
TYPE_CONTROLS = named("type_controls")
TYPE_SET_PAUSED = named("type_set_paused")
TYPE_SET_LIMITS = named("type_set_limits")


def partitioning(r: Mapping[str, Any]) -> Partitioning | None:
    """A ``job_types`` row's partition settings; None for a type without any."""
    p = Partitioning(
        tuple(r["partition_by"]) if r["partition_by"] else None,
        r["partition_concurrency"],
        r["partition_rate_limit"],
        r["partition_rate_period"],
        r["ordered"],
    )
    return None if p == Partitioning() else p


class TypeStatements(Statements):
    async def job_type_register_many(
        self, conn: Connection, types: Sequence[JobTypeDefaults]
    ) -> None:
        """Insert or refresh (defaults, ``last_seen``) the given types, in name order so that
        workers starting together never deadlock."""
        values = {
            "name": [t.name for t in types],
            "max_retries": [t.max_retries for t in types],
            "timeout_seconds": [t.timeout_seconds for t in types],
            "retry_delays": [",".join(str(d) for d in t.retry_delays or ()) for t in types],
            "concurrency": [t.concurrency for t in types],
            "rate_limit": [t.rate_limit for t in types],
            "rate_period": [t.rate_period for t in types],
        }
        parts = [t.partition or Partitioning() for t in types]
        values |= {
            "partition_by": [json.dumps(p.by) if p.by else None for p in parts],
            "partition_concurrency": [p.concurrency for p in parts],
            "partition_rate_limit": [p.rate_limit for p in parts],
            "partition_rate_period": [p.rate_period for p in parts],
            "ordered": [p.ordered for p in parts],
        }
        name = JOB_TYPE_REGISTER_MANY
        await conn.execute(self.sql[name], *bind(name, values))

    async def job_type_names(self, conn: Connection) -> frozenset[str]:
        return frozenset(await conn.fetchval(self.sql[JOB_TYPE_NAMES]))

    async def job_type_list(self, conn: Connection) -> list[JobType]:
        rows = await conn.fetch(self.sql[JOB_TYPE_LIST])
        return [
            JobType(
                name=r["name"],
                max_retries=r["max_retries"],
                timeout_seconds=r["timeout_seconds"],
                retry_delays=tuple(r["retry_delays"] or ()),
                first_seen=r["first_seen"],
                last_seen=r["last_seen"],
                paused=r["paused"],
                concurrency=r["concurrency"],
                rate_limit=r["rate_limit"],
                rate_period=r["rate_period"],
                limits_set_at=r["limits_set_at"],
                running=r["running"],
                partition=partitioning(r),
            )
            for r in rows
        ]

    async def type_controls(self, conn: Connection) -> list[TypeControl]:
        rows = await conn.fetch(self.sql[TYPE_CONTROLS])
        return [TypeControl(r["name"], r["paused"]) for r in rows]

    async def type_set_paused(self, conn: Connection, name: str, paused: bool) -> bool:
        """False when no such type."""
        return await conn.fetchval(self.sql[TYPE_SET_PAUSED], name, paused) is not None

    async def type_set_limits(
        self,
        conn: Connection,
        name: str,
        *,
        concurrency: int | None,
        rate_limit: int | None,
        rate_period: int | None,
    ) -> bool:
        """False when no such type."""
        found = await conn.fetchval(
            self.sql[TYPE_SET_LIMITS], name, concurrency, rate_limit, rate_period
        )
        return found is not None
