"""The schedules duty: one pass enqueues the jobs of every tick that has come (``plan`` in
``conveyor.jobs.schedules`` says which), in the transaction that locks the due schedules and moves
their ``next_run_at`` on. Safe in any number of sweepers (see ``store/schedules.py``).

A sweeper paused inside that transaction (VM freeze, long GC, partition) keeps its connection and
its locks: PostgreSQL ends its session after ``HOLD_IDLE_SECONDS`` idle in the transaction (a
bound set by the pass itself), the transaction rolls back, and another sweeper's next pass takes
the schedule over. The ticks it enqueues then may be older than the grace: they are not missed
(the fleet was running, a peer held the lock), so they run, once. ``Watch`` is how a sweeper
tells the two apart: since when it has passed without a gap longer than the grace."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from ..core.jobs import new_job_id
from ..core.logging import event
from ..jobs.schedules import InvalidSchedule, Rule, plan
from ..jobs.spec import dump_json
from ..store import NewJob, Store
from ..store.bounds import DUTY_BOUND_SECONDS
from ..store.schedules import Advance, ScheduleRow

log = logging.getLogger("conveyor.sweeper")

BATCH = 100
# A tick's unique key outlives any sweeper that could still be working on the tick.
TICK_KEY_SECONDS = 3600.0
# A schedule whose rule no longer evaluates (a time zone gone from tzdata) is looked at again
RETRY_INVALID_SECONDS = 3600.0
# The pass's transaction takes milliseconds; idle in it this long, the sweeper is paused: its
# session is ended so its locks go. A lock wait in it (a tick key another transaction is
# inserting) fails after LOCK_WAIT_SECONDS; the next pass tries again.
HOLD_IDLE_SECONDS = LOCK_WAIT_SECONDS = DUTY_BOUND_SECONDS


@dataclass
class Watch:
    """Since when one sweeper has passed over the schedules with no gap longer than the grace
    (the database's clock). Every tick that came in that time was seen by a running sweeper:
    if it is still due, a peer held its schedule (paused inside its transaction), and the tick
    is late, not missed. A gap longer than the grace (this sweeper was down, frozen, or could
    not reach the database) starts the watch again."""

    since: datetime | None = None
    last: datetime | None = None

    def start(self, at: datetime, grace: float) -> datetime:
        if self.since is None or self.last is None or (at - self.last).total_seconds() > grace:
            self.since = at
        return self.since

    def passed(self, at: datetime) -> None:
        self.last = at if self.last is None else max(self.last, at)


@dataclass
class SchedulePass:
    enqueued: int = 0
    duplicates: int = 0  # ticks another sweeper had already enqueued (the unique key held)
    missed: int = 0
    jobs: dict[str, list[uuid.UUID]] = field(default_factory=dict)  # by schedule name


def tick_key(row: ScheduleRow, tick: datetime) -> str:
    return f"{row.job_type}/schedule/{row.name}/{tick.isoformat()}"


def tick_job(row: ScheduleRow, tick: datetime) -> NewJob:
    return NewJob(
        id=new_job_id(),
        job_type=row.job_type,
        payload_json=dump_json(row.payload).decode(),
        priority=row.priority,
        meta_json=orjson.dumps({"schedule": row.name, "tick": tick.isoformat()}).decode(),
        unique_key=tick_key(row, tick),
        unique_for=TICK_KEY_SECONDS,
    )


async def enqueue_due(
    pool: Any,
    store: Store,
    *,
    now: datetime | None,
    grace: float,
    batch: int = BATCH,
    watch: Watch | None = None,
) -> SchedulePass:
    """One pass over the due schedules at ``now`` (default: the database's clock). ``watch``:
    the sweeper's own (kept across passes); without it, every tick older than the grace is
    missed."""
    result = SchedulePass()
    watch = watch or Watch()
    at: datetime | None = None
    while True:
        async with pool.acquire() as conn, conn.transaction():
            clock = await store.maintenance_bound(
                conn, idle=HOLD_IDLE_SECONDS, lock_wait=LOCK_WAIT_SECONDS
            )
            at = now if now is not None else clock
            since = watch.start(at, grace)
            due = await store.schedule_take_due(conn, at, limit=batch)
            jobs: list[tuple[ScheduleRow, datetime, NewJob]] = []
            advances: list[Advance] = []
            for row in due:
                try:
                    rule = Rule(row.cron, row.every_seconds, row.timezone)
                except InvalidSchedule as exc:
                    event(
                        log, "schedule_invalid", logging.WARNING, schedule=row.name, error=str(exc)
                    )
                    retry = at.timestamp() + RETRY_INVALID_SECONDS
                    advances.append(
                        Advance(row.name, datetime.fromtimestamp(retry, at.tzinfo), None, None)
                    )
                    continue
                p = plan(
                    rule,
                    row.next_run_at,
                    at,
                    grace=grace,
                    catch_up=row.catch_up,
                    watched_since=since,
                )
                if p.missed:
                    result.missed += p.missed
                    event(
                        log,
                        "schedule_ticks_missed",
                        logging.WARNING,
                        schedule=row.name,
                        missed=p.missed,
                        catch_up=row.catch_up,
                    )
                jobs.extend((row, tick, tick_job(row, tick)) for tick in p.ticks)
                last = jobs[-1] if p.ticks else None
                advances.append(
                    Advance(
                        row.name,
                        p.next_run_at,
                        last[1] if last else None,
                        last[2].id if last else None,
                    )
                )
            if jobs:
                done = await store.job_insert_checked(conn, [j for _, _, j in jobs])
                for row, _, job in jobs:
                    if job.id in done.inserted:
                        result.enqueued += 1
                        result.jobs.setdefault(row.name, []).append(job.id)
                    else:
                        result.duplicates += 1
                if done.inserted:
                    await store.outbox_notify(conn)
            if advances:
                await store.schedule_advance(conn, advances)
        if len(due) < batch:
            watch.passed(at)
            return result
