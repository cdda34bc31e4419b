"""Schedules: cron / interval rules that the sweeper turns into jobs, one per tick.

Exactly one job per tick, however many sweepers pass: the due schedules are locked
(``FOR UPDATE SKIP LOCKED``: a second sweeper skips a schedule another is enqueueing, then finds
its ``next_run_at`` moved past the tick), and each tick's job carries the unique key
``<type>/schedule/<name>/<tick>`` in ``job_uniques`` (``store/unique.py``), so even a sweeper
working from a stale read cannot enqueue a tick twice. The transaction holding those locks is
bounded by PostgreSQL (``maintenance_bound``), so a sweeper paused inside it holds them for
seconds, not for as long as the pause."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from .base import Connection, Statements
from .registry import statement

_COLUMNS = """name, job_type, payload::text AS payload, cron, every_seconds, timezone, priority,
    enabled, catch_up, source, next_run_at, last_tick_at, last_job_id, created_at, updated_at"""

# A run-time upsert (source 'api' or 'cli') replaces any schedule of that name; a handler's
# (source 'code') replaces only a handler's and keeps its paused state. The next tick is kept
# while the rule is unchanged.
SCHEDULE_UPSERT = statement(
    "schedule_upsert",
    f"""
INSERT INTO __schema__.schedules AS s (name, job_type, payload, cron, every_seconds, timezone,
                                       priority, enabled, catch_up, source, next_run_at)
VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (name) DO UPDATE SET
    job_type = EXCLUDED.job_type, payload = EXCLUDED.payload, cron = EXCLUDED.cron,
    every_seconds = EXCLUDED.every_seconds, timezone = EXCLUDED.timezone,
    priority = EXCLUDED.priority, catch_up = EXCLUDED.catch_up, source = EXCLUDED.source,
    enabled = CASE WHEN EXCLUDED.source = 'code' THEN s.enabled ELSE EXCLUDED.enabled END,
    next_run_at = CASE
        WHEN NOT (CASE WHEN EXCLUDED.source = 'code' THEN s.enabled ELSE EXCLUDED.enabled END)
        THEN NULL
        WHEN s.cron IS NOT DISTINCT FROM EXCLUDED.cron
             AND s.every_seconds IS NOT DISTINCT FROM EXCLUDED.every_seconds
             AND s.timezone = EXCLUDED.timezone AND s.enabled AND s.next_run_at IS NOT NULL
        THEN s.next_run_at ELSE EXCLUDED.next_run_at END,
    updated_at = now()
WHERE EXCLUDED.source <> 'code' OR s.source = 'code'
RETURNING {_COLUMNS}, (xmax = 0) AS created
""",
)

SCHEDULE_GET = statement(
    "schedule_get", f"SELECT {_COLUMNS} FROM __schema__.schedules WHERE name = $1"
)

SCHEDULE_LIST = statement(
    "schedule_list", f"SELECT {_COLUMNS} FROM __schema__.schedules ORDER BY name"
)

SCHEDULE_DELETE = statement(
    "schedule_delete", "DELETE FROM __schema__.schedules WHERE name = $1 RETURNING name"
)

# A paused schedule has no next tick; resume plans from now ($3): ticks that fell while the
# schedule was paused never run (they were not missed, they were paused).
SCHEDULE_SET_ENABLED = statement(
    "schedule_set_enabled",
    f"""
UPDATE __schema__.schedules SET
    enabled = $2,
    next_run_at = CASE WHEN NOT $2 THEN NULL WHEN NOT enabled THEN $3 ELSE next_run_at END,
    updated_at = now()
WHERE name = $1
RETURNING {_COLUMNS}
""",
)

SCHEDULE_TAKE_DUE = statement(
    "schedule_take_due",
    f"""
SELECT {_COLUMNS} FROM __schema__.schedules
WHERE enabled AND (next_run_at <= $1 OR next_run_at IS NULL)
ORDER BY next_run_at NULLS FIRST
LIMIT $2
FOR UPDATE SKIP LOCKED
""",
)

SCHEDULE_ADVANCE = statement(
    "schedule_advance",
    """
UPDATE __schema__.schedules s SET
    next_run_at = u.next_run_at,
    last_tick_at = COALESCE(u.last_tick_at, s.last_tick_at),
    last_job_id = COALESCE(u.last_job_id, s.last_job_id),
    updated_at = now()
FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::uuid[])
    AS u(name, next_run_at, last_tick_at, last_job_id)
WHERE s.name = u.name
""",
)

DB_CLOCK = statement("db_clock", "SELECT clock_timestamp()")


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    name: str
    job_type: str
    payload: dict[str, Any]
    cron: str | None
    every_seconds: float | None
    timezone: str
    priority: int
    enabled: bool
    catch_up: str
    source: str
    next_run_at: datetime | None
    last_tick_at: datetime | None
    last_job_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_record(cls, r: Any) -> ScheduleRow:
        return cls(
            name=r["name"],
            job_type=r["job_type"],
            payload=orjson.loads(r["payload"]),
            cron=r["cron"],
            every_seconds=r["every_seconds"],
            timezone=r["timezone"],
            priority=r["priority"],
            enabled=r["enabled"],
            catch_up=r["catch_up"],
            source=r["source"],
            next_run_at=r["next_run_at"],
            last_tick_at=r["last_tick_at"],
            last_job_id=r["last_job_id"],
            created_at=r["created_at"],
            updated_at=r["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class NewSchedule:
    name: str
    job_type: str
    payload_json: str
    cron: str | None
    every_seconds: float | None
    timezone: str
    priority: int
    enabled: bool
    catch_up: str
    source: str
    next_run_at: datetime | None


@dataclass(frozen=True, slots=True)
class Advance:
    name: str
    next_run_at: datetime
    last_tick_at: datetime | None
    last_job_id: uuid.UUID | None


class ScheduleStatements(Statements):
    async def schedule_upsert(
        self, conn: Connection, s: NewSchedule
    ) -> tuple[ScheduleRow, bool] | None:
        """(row, created); None when a handler's schedule met an API schedule of that name."""
        r = await conn.fetchrow(
            self.sql[SCHEDULE_UPSERT], s.name, s.job_type, s.payload_json, s.cron,
            s.every_seconds, s.timezone, s.priority, s.enabled, s.catch_up, s.source,
            s.next_run_at,
        )  # fmt: skip
        return None if r is None else (ScheduleRow.from_record(r), bool(r["created"]))

    async def schedule_get(self, conn: Connection, name: str) -> ScheduleRow | None:
        r = await conn.fetchrow(self.sql[SCHEDULE_GET], name)
        return None if r is None else ScheduleRow.from_record(r)

    async def schedule_list(self, conn: Connection) -> list[ScheduleRow]:
        return [ScheduleRow.from_record(r) for r in await conn.fetch(self.sql[SCHEDULE_LIST])]

    async def schedule_delete(self, conn: Connection, name: str) -> bool:
        return await conn.fetchval(self.sql[SCHEDULE_DELETE], name) is not None

    async def schedule_set_enabled(
        self, conn: Connection, name: str, enabled: bool, next_run_at: datetime | None
    ) -> ScheduleRow | None:
        r = await conn.fetchrow(self.sql[SCHEDULE_SET_ENABLED], name, enabled, next_run_at)
        return None if r is None else ScheduleRow.from_record(r)

    async def schedule_take_due(
        self, conn: Connection, now: datetime, *, limit: int
    ) -> list[ScheduleRow]:
        """Lock the enabled schedules due at ``now`` (call inside a transaction)."""
        rows = await conn.fetch(self.sql[SCHEDULE_TAKE_DUE], now, limit)
        return [ScheduleRow.from_record(r) for r in rows]

    async def schedule_advance(self, conn: Connection, items: Sequence[Advance]) -> None:
        await conn.execute(
            self.sql[SCHEDULE_ADVANCE],
            [a.name for a in items],
            [a.next_run_at for a in items],
            [a.last_tick_at for a in items],
            [a.last_job_id for a in items],
        )

    async def db_clock(self, conn: Connection) -> datetime:
        value: datetime = await conn.fetchval(self.sql[DB_CLOCK])
        return value
