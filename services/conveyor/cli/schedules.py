"""``conveyor schedules list|add|pause|resume|delete``: run-time schedules, straight on the
database (like ``conveyor jobs``); the same rules and 422 messages as ``POST /schedules``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from ..core.config import Settings
from ..jobs.schedules import build_schedule, resume_at
from ..jobs.types import KnownTypes
from .support import database, list_by_default, listing, run, when


def add_parser(sub: Any) -> None:
    s = sub.add_parser("schedules", help="list, add, pause, resume or delete schedules")
    acts = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = acts.add_parser("list", help="every schedule with its next tick")
    ls.add_argument("--json", action="store_true", help="one JSON object per schedule (JSON Lines)")
    a = acts.add_parser("add", help="create or replace a schedule")
    a.add_argument("name", help="the schedule's name (an existing one is replaced)")
    a.add_argument("--type", required=True, help="the job type each tick enqueues")
    rule = a.add_mutually_exclusive_group(required=True)
    rule.add_argument("--cron", help='5 fields, e.g. "*/5 * * * *"')
    rule.add_argument("--every", type=float, help="seconds between ticks (>= 1)")
    a.add_argument("--timezone", default="UTC", help="IANA zone of --cron (default UTC)")
    a.add_argument("--payload", default="{}", help="JSON object given to every job")
    a.add_argument(
        "--priority", default="normal", help="high, normal (default), low, or 0-9, of each job"
    )
    a.add_argument(
        "--catch-up",
        choices=["skip", "last"],
        default="skip",
        help="ticks missed while no sweeper ran: skip them (default), or run the last one once",
    )
    a.add_argument("--paused", action="store_true", help="create it paused")
    for name, help_ in (
        ("pause", "stop enqueueing until resumed"),
        ("resume", "enqueue again from the next tick"),
        ("delete", "remove the schedule (its jobs stay)"),
    ):
        acts.add_parser(name, help=help_).add_argument("name", help="the schedule's name")
    s.set_defaults(func=cmd_schedules)
    list_by_default(s, acts, ls)


def _line(row: Any) -> str:
    rule = f'cron "{row.cron}" tz={row.timezone}' if row.cron else f"every={row.every_seconds:g}s"
    state = "enabled" if row.enabled else "paused"
    nxt = when(row.next_run_at)
    return f"{row.name:<24} {row.job_type:<20} {rule:<36} {state:<8} next={nxt} ({row.source})"


def cmd_schedules(args: argparse.Namespace) -> int:
    from ..api.schedules import schedule_dict  # FastAPI: imported by the command that uses it

    settings = Settings()

    async def go() -> int:
        async with database(settings) as (store, conn):
            if args.action == "list":
                listing(await store.schedule_list(conn), args.json, schedule_dict, _line)
                return 0
            if args.action == "add":
                priority: int | str = args.priority
                if isinstance(priority, str) and priority.isdigit():
                    priority = int(priority)
                new = build_schedule(
                    args.name,
                    args.type,
                    payload=orjson.loads(args.payload),
                    cron=args.cron,
                    every_seconds=args.every,
                    timezone=args.timezone,
                    priority=priority,
                    enabled=not args.paused,
                    catch_up=args.catch_up,
                    now=await store.db_clock(conn),
                    source="cli",
                )
                if not settings.accept_unknown_types:  # the API's rule: no type no worker runs
                    await KnownTypes(store).check(conn, [new.job_type])
                done = await store.schedule_upsert(conn, new)
                assert done is not None
                print(("created " if done[1] else "replaced ") + _line(done[0]))
                return 0
            row = await store.schedule_get(conn, args.name)
            if row is None:
                print(f"conveyor schedules: no schedule {args.name}", file=sys.stderr)
                return 1
            if args.action == "delete":
                await store.schedule_delete(conn, args.name)
                print(f"deleted {args.name}")
                return 0
            enabled = args.action == "resume"
            after = await store.schedule_set_enabled(
                conn,
                args.name,
                enabled,
                resume_at(row, await store.db_clock(conn)) if enabled else None,
            )
            assert after is not None
            print(_line(after))
            return 0

    return run(go(), failed=True)  # ValueError: InvalidJob, a --payload that is not JSON
