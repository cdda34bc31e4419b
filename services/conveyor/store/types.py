"""Job types: the ones workers (or a deploy step) registered, with their handlers' defaults,
and their controls (pause, fleet-wide limits; admission enforces them,
``sql/schema/admission.sql``). The API and ``enqueue()`` accept only these types (see
``conveyor.jobs.types``). The keys of a partitioned type and an operator's settings of each
(``partitions``): read and changed here, for the API and the CLI alike."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..core.limits import Partitioning
from .base import Connection, Statements
from .registry import bind, named
from .rows import JobType, JobTypeDefaults, PartitionRow, TypeControl

JOB_TYPE_REGISTER_MANY = named("job_type_register_many")
JOB_TYPE_NAMES = named("job_type_names")
JOB_TYPE_LIST = named("job_type_list")
TYPE_CONTROLS = named("type_controls")
TYPE_SET_PAUSED = named("type_set_paused")
TYPE_SET_LIMITS = named("type_set_limits")
PARTITION_PAGE = named("partition_page")
PARTITION_GET = named("partition_get")
PARTITION_SET = named("partition_set")
PARTITION_PRUNE = named("partition_prune")


class Unchanged(enum.Enum):
    """A setting left as it is (``partition_set``)."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


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

    async def partition_page(
        self,
        conn: Connection,
        job_type: str,
        *,
        after: tuple[datetime | None, str] | None,
        limit: int,
    ) -> list[PartitionRow]:
        """Up to ``limit`` keys of ``job_type``, oldest wait first, after the key ``after``
        (its ``since`` and its key: the last row of the previous page); none for an unknown
        type (``job_type_names`` tells). Which keys, and how each is counted:
        ``partition_page`` in ``sql/types.sql``."""
        since, key = after if after is not None else (None, None)
        values = {"job_type": job_type, "after_since": since, "after_key": key, "limit": limit}
        rows = await conn.fetch(self.sql[PARTITION_PAGE], *bind(PARTITION_PAGE, values))
        return [PartitionRow.of(r) for r in rows]

    async def partition_get(self, conn: Connection, job_type: str, key: str) -> PartitionRow | None:
        """One key of ``job_type`` (with no job and no override: all zero); None when the type
        is unknown."""
        name = PARTITION_GET
        row = await conn.fetchrow(self.sql[name], *bind(name, {"job_type": job_type, "key": key}))
        return None if row is None else PartitionRow.of(row)

    async def partition_set(
        self,
        conn: Connection,
        job_type: str,
        key: str,
        *,
        concurrency: int | Unchanged | None = UNCHANGED,
        paused: bool | None = None,
    ) -> PartitionRow | None:
        """An operator's settings of one key, kept until removed: ``concurrency`` (None: no
        override, the type's ``partition_concurrency`` applies) and ``paused`` (None: as it
        is). A row left holding nothing is deleted, unless it keeps an ordered key's commit
        counter. Wakes the type's admitters at commit. Run it in a transaction. Returns the
        key's view; None when the type is unknown."""
        values = {
            "job_type": job_type,
            "key": key,
            "set_concurrency": concurrency is not UNCHANGED,
            "concurrency": None if isinstance(concurrency, Unchanged) else concurrency,
            "paused": paused,
        }
        empty = await conn.fetchval(self.sql[PARTITION_SET], *bind(PARTITION_SET, values))
        if empty is None:
            return None
        if empty:
            await conn.execute(self.sql[PARTITION_PRUNE], job_type, key)
        return await self.partition_get(conn, job_type, key)
