"""Schedules: cron / interval rules that the sweeper turns into jobs, one per tick.

Exactly one job per tick, however many sweepers pass: the due schedules are locked
(``FOR UPDATE SKIP LOCKED``: a second sweeper skips a schedule another is enqueueing, then finds
its ``next_run_at`` moved past the tick), and each tick's job carries the unique key
``<type>/schedule/<name>/<tick>`` in ``job_uniques`` (``store/jobs.py``), so even a sweeper
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
from .registry import bind, named

SCHEDULE_UPSERT = named("schedule_upsert")
SCHEDULE_GET = named("schedule_get")
SCHEDULE_LIST = named("schedule_list")
SCHEDULE_DELETE = named("schedule_delete")
SCHEDULE_SET_ENABLED = named("schedule_set_enabled")
SCHEDULE_TAKE_DUE = named("schedule_take_due")
SCHEDULE_ADVANCE = named("schedule_advance")
DB_CLOCK = named("db_clock")


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
        values = {
            "name": s.name,
            "job_type": s.job_type,
            "payload": s.payload_json,
            "cron": s.cron,
            "every_seconds": s.every_seconds,
            "timezone": s.timezone,
            "priority": s.priority,
            "enabled": s.enabled,
            "catch_up": s.catch_up,
            "source": s.source,
            "next_run_at": s.next_run_at,
        }
        r = await conn.fetchrow(self.sql[SCHEDULE_UPSERT], *bind(SCHEDULE_UPSERT, values))
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
