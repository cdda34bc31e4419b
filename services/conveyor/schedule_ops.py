"""Creating, pausing and resuming schedules: what the API, the CLI and a worker's start share.
A new (or resumed) schedule's first tick is the first one after "now": ticks from before it
existed, or from while it was paused, never run. "Now" is the database's clock
(``Store.db_clock``), like every tick the sweeper plans: a host whose clock runs ahead would
otherwise skip the ticks between the two clocks."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from .core.finite import check_finite
from .core.jobs import check_type, parse_priority
from .enqueue import _NUL
from .router import JobRouter
from .schedules import InvalidSchedule, Rule, check_catch_up
from .store import Connection, Store, for_schema
from .store.schedules import NewSchedule, ScheduleRow
from .store.schema import DEFAULT_SCHEMA

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
_NAME = re.compile(NAME_PATTERN)
MAX_SCHEDULE_PAYLOAD = 64 * 1024


def build_schedule(
    name: str,
    job_type: str,
    *,
    payload: Mapping[str, Any] | None = None,
    cron: str | None = None,
    every_seconds: float | None = None,
    timezone: str = "UTC",
    priority: int | str | None = None,
    enabled: bool = True,
    catch_up: str = "skip",
    source: str = "api",
    now: datetime | None = None,
) -> NewSchedule:
    """Validate a schedule (``InvalidSchedule``, a 422) and plan its first tick after ``now``
    (the database's clock, ``Store.db_clock``; this host's when not given: validation only)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidSchedule(
            "name must be 1-100 letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    check_type(job_type)
    rule = Rule(cron, every_seconds, timezone)
    check_catch_up(catch_up)
    if payload is not None and not isinstance(payload, Mapping):  # the CLI's parsed --payload
        raise InvalidSchedule("payload must be a JSON object under 64 KiB without NUL characters")
    try:
        body = orjson.dumps(payload or {})
    except TypeError as exc:  # an integer over 64 bits
        raise InvalidSchedule(f"payload is not storable JSON: {exc}") from None
    if (where := check_finite(payload, body, "payload")) is not None:
        raise InvalidSchedule(where)
    if len(body) > MAX_SCHEDULE_PAYLOAD or _NUL.search(body):
        raise InvalidSchedule("payload must be a JSON object under 64 KiB without NUL characters")
    first = rule.next_after(now or datetime.now(UTC)) if enabled else None
    return NewSchedule(
        name=name,
        job_type=job_type,
        payload_json=body.decode(),
        cron=cron,
        every_seconds=every_seconds,
        timezone=timezone,
        priority=parse_priority(priority),
        enabled=enabled,
        catch_up=catch_up,
        source=source,
        next_run_at=first,
    )


def resume_at(row: ScheduleRow, now: datetime) -> datetime:
    """The first tick after ``now`` (the database's clock): where a resumed schedule starts."""
    return Rule(row.cron, row.every_seconds, row.timezone).next_after(now)


async def register_router_schedules(
    conn: Connection,
    router: JobRouter,
    types: Iterable[str] | None = None,
    *,
    store: Store | None = None,
    schema: str | None = None,
) -> list[str]:
    """Upsert the schedules declared on ``router``'s handlers (``schedule=`` / ``every=``),
    each named after its type. A schedule paused by an operator stays paused; one created
    through the API under the same name is left alone. Returns the names registered."""
    store = store or for_schema(schema or os.environ.get("CONVEYOR_DB_SCHEMA") or DEFAULT_SCHEMA)
    names = []
    wanted = set(types) if types is not None else None
    now = await store.db_clock(conn)
    for job_type, timed in sorted(router.schedules.items()):
        if wanted is not None and job_type not in wanted:
            continue
        rule = timed.rule
        new = build_schedule(
            job_type,
            job_type,
            cron=rule.cron,
            every_seconds=rule.every,
            timezone=rule.timezone,
            catch_up=timed.catch_up,
            source="code",
            now=now,
        )
        if await store.schedule_upsert(conn, new) is not None:
            names.append(job_type)
    return names
