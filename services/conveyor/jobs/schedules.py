"""Schedules: their rules and ticks, and what a valid schedule is.

A rule is a standard 5-field cron expression in a time zone, or ``every`` N seconds. Cron is
evaluated by ``cronsim`` (maintained; written for Healthchecks.io, it follows Debian cron
including its DST behaviour: a time that falls in the hour skipped by spring-forward runs once,
right after the change; a fixed time in the hour repeated by fall-back runs once; ``*`` / step
hours, which are real elapsed times, run in both copies of the repeated hour). Chosen over
croniter, whose PyPI project was declared abandoned in 2025 before pallets-eco took it over, and
whose DST handling has a long issue history. ``every`` ticks are aligned to multiples of N
seconds since the Unix epoch, so every sweeper computes the same ticks whatever its start.

Which ticks run (``plan``): every tick in ``[next_run_at, now]`` that is at most ``grace``
seconds old runs exactly once; older ticks were *missed* (no sweeper ran): skipped, or with
``catch_up="last"`` the newest missed one runs once when no fresh tick runs in the same pass.
A tick is only missed when no sweeper ran: one that a sweeper saw come while a paused peer held
the schedule is *delayed*, and runs when the schedule is free (``watched_since``).

A new (or resumed) schedule's first tick is the first one after "now" (``build_schedule``,
``resume_at``; shared by the API, the CLI and a worker's start): ticks from before it existed, or
from while it was paused, never run. "Now" is the database's clock (``Store.db_clock``), like
every tick the sweeper plans: a host whose clock runs ahead would otherwise skip the ticks
between the two clocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ..core.errors import InvalidJob
from ..core.jobs import check_type, is_name, parse_priority
from ..store.schedules import NewSchedule, ScheduleRow
from .spec import encode_object

CATCH_UP = ("skip", "last")
MIN_EVERY = 1.0
MAX_EVERY = 366 * 86400.0
MAX_TICKS_PER_PASS = 1000  # per schedule: bounded by grace / every anyway
MAX_SCHEDULE_PAYLOAD = 64 * 1024
_TINY = timedelta(microseconds=1)


class InvalidSchedule(InvalidJob):
    """An invalid cron expression, time zone, interval or catch-up policy (422)."""


@dataclass(frozen=True)
class Rule:
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise InvalidSchedule("give cron or every_seconds, not both and not neither")
        zone(self.timezone)
        if self.cron is not None:
            if not isinstance(self.cron, str) or len(self.cron.split()) != 5:
                raise InvalidSchedule(
                    "cron must have 5 fields: minute hour day-of-month month day-of-week"
                )
            try:
                first = next(CronSim(self.cron, datetime.now(UTC)), None)
            except CronSimError as exc:
                raise InvalidSchedule(f"invalid cron expression {self.cron!r}: {exc}") from None
            if first is None:
                raise InvalidSchedule(f"cron expression {self.cron!r} never matches")
        else:
            every = self.every
            if not (
                isinstance(every, int | float)
                and not isinstance(every, bool)
                and math.isfinite(every)
                and MIN_EVERY <= every <= MAX_EVERY
            ):
                raise InvalidSchedule(f"every_seconds must be a number from 1 to {MAX_EVERY:.0f}")

    def ticks(self, start: datetime) -> Iterator[datetime]:
        """Ticks at or after ``start`` (aware), in UTC, ascending."""
        if self.every is not None:
            k = math.ceil(start.timestamp() / self.every)
            while True:
                yield datetime.fromtimestamp(k * self.every, UTC)
                k += 1
        assert self.cron is not None
        local = (start - _TINY).astimezone(zone(self.timezone))
        for t in CronSim(self.cron, local):
            if t >= start:
                yield t.astimezone(UTC)

    def previous(self, before: datetime) -> datetime | None:
        """The newest tick strictly before ``before``."""
        if self.every is not None:
            k = math.ceil(before.timestamp() / self.every) - 1
            return datetime.fromtimestamp(k * self.every, UTC)
        assert self.cron is not None
        local = before.astimezone(zone(self.timezone))
        return next(
            (t.astimezone(UTC) for t in CronSim(self.cron, local, reverse=True) if t < before),
            None,
        )

    def next_after(self, t: datetime) -> datetime:
        """The first tick strictly after ``t``."""
        return next(self.ticks(t + _TINY))


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidSchedule(
            f"unknown time zone {name!r} (an IANA name like Europe/Berlin)"
        ) from None


@dataclass(frozen=True)
class CodeSchedule:
    """``schedule=`` / ``every=`` on a handler: the schedule named after its type."""

    rule: Rule
    catch_up: str = "skip"


def check_catch_up(catch_up: str) -> str:
    if catch_up not in CATCH_UP:
        raise InvalidSchedule(f"catch_up must be one of {', '.join(CATCH_UP)}")
    return catch_up


def code_schedule(
    cron: str | None, every: float | None, timezone: str, catch_up: str
) -> CodeSchedule | None:
    if cron is None and every is None:
        return None
    return CodeSchedule(Rule(cron, every, timezone), check_catch_up(catch_up))


@dataclass(frozen=True)
class Plan:
    ticks: list[datetime]  # to enqueue, one job each
    missed: int  # ticks older than the grace that did not run (at least; counted up to a bound)
    next_run_at: datetime


def plan(
    rule: Rule,
    next_run_at: datetime | None,
    now: datetime,
    *,
    grace: float,
    catch_up: str,
    watched_since: datetime | None = None,
) -> Plan:
    """The ticks a sweeper passing at ``now`` enqueues, and the schedule's next ``next_run_at``.
    ``next_run_at`` None (never planned): nothing runs, the first tick after ``now`` is next.
    ``watched_since``: since when the sweeper has passed without a gap longer than ``grace``
    (default ``now``); a tick that was fresh then was delayed by a peer holding the schedule,
    not missed, and runs."""
    now = now.astimezone(UTC)
    if next_run_at is None or next_run_at > now:
        return Plan([], 0, next_run_at or rule.next_after(now))
    watched = now if watched_since is None else min(now, watched_since.astimezone(UTC))
    fresh_from = watched - timedelta(seconds=grace)
    ticks: list[datetime] = []
    for t in rule.ticks(max(next_run_at, fresh_from)):
        if t > now or len(ticks) >= MAX_TICKS_PER_PASS:
            break
        ticks.append(t)
    missed = 0
    if next_run_at < fresh_from:
        newest_missed = rule.previous(fresh_from)
        if newest_missed is not None and newest_missed >= next_run_at:
            missed = 1
            for t in rule.ticks(next_run_at):
                if t >= newest_missed or missed >= MAX_TICKS_PER_PASS:
                    break
                missed += 1
            if catch_up == "last" and not ticks:
                ticks.append(newest_missed)
                missed -= 1
    return Plan(ticks, missed, rule.next_after(now))


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
    (the database's clock, ``Store.db_clock``; this host's when not given: validation only).
    The payload is encoded as an enqueued job's, so each tick's job holds the same JSON."""
    if not is_name(name):  # a handler's schedule is named after its type: the same pattern
        raise InvalidSchedule(
            "name must be 1-100 letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    check_type(job_type)
    rule = Rule(cron, every_seconds, timezone)
    check_catch_up(catch_up)
    body = encode_object(
        {} if payload is None else payload, "payload", MAX_SCHEDULE_PAYLOAD, error=InvalidSchedule
    )
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
