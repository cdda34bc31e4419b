"""``conveyor types list|register|pause|resume|limit``: the job types the API accepts (see
``job_types``), their pause flag and fleet-wide limits (``store/types.py``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..core.config import Settings
from ..core.limits import check_concurrency, parse_rate
from ..jobs.types import register_router_schedules, router_types
from ..store import Store
from .support import database, list_by_default, listing, run, shown, when


def add_parser(sub: Any) -> None:
    s = sub.add_parser("types", help="list the known job types, or register a router's types")
    actions = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = actions.add_parser("list", help="the types workers registered, with their defaults")
    ls.add_argument(
        "--json", action="store_true", help="one JSON object per type, as GET /types (JSON Lines)"
    )
    r = actions.add_parser(
        "register", help="register a router's types without running a worker (a deploy step)"
    )
    r.add_argument("--app", required=True, help="MODULE:ATTR naming a conveyor.JobRouter")
    r.add_argument("--types", help="comma-separated subset (default: every handler)")
    for name, help_ in (
        ("pause", "pause a type fleet-wide: its jobs are accepted and wait"),
        ("resume", "resume a paused type"),
    ):
        actions.add_parser(name, help=help_).add_argument("type", help="the job type")
    lim = actions.add_parser("limit", help="change a type's fleet-wide limits at run time")
    lim.add_argument("type", help="the job type")
    lim.add_argument("--concurrency", help="at most N IN_PROGRESS across all workers; 'none'")
    lim.add_argument("--rate-limit", help="at most N starts per window, e.g. 100/m; 'none'")
    s.set_defaults(func=cmd_types)
    list_by_default(s, actions, ls)


def _limit_value(text: str | None, parse: Any) -> Any:
    return None if text is None or text.lower() == "none" else parse(text)


def _line(t: Any, rate_limit: Any) -> str:
    delays = ",".join(map(str, t.retry_delays)) or "-"
    timeout = "-" if t.timeout_seconds is None else f"{t.timeout_seconds:g}s"
    return (
        f"{t.name:<32} {'PAUSED' if t.paused else 'active':<6} concurrency={shown(t.concurrency)}"
        f" rate_limit={shown(rate_limit)} running={t.running}"
        f" max_retries={shown(t.max_retries)} timeout={timeout}"
        f" retry_delays={delays} last_seen={when(t.last_seen)}"
    )


def cmd_types(args: argparse.Namespace) -> int:
    from ..api.types_routes import type_dict  # FastAPI and uvicorn: only for this command
    from . import processes

    settings = Settings()
    router = processes.load_router(args.app) if args.action == "register" else None

    async def change(store: Store, conn: Any) -> int:
        name = args.type
        if args.action in ("pause", "resume"):
            found = await store.type_set_paused(conn, name, args.action == "pause")
        else:
            current = {t.name: t for t in await store.job_type_list(conn)}.get(name)
            if current is None:
                found = False
            else:
                conc = current.concurrency
                if args.concurrency is not None:
                    conc = check_concurrency(_limit_value(args.concurrency, int))
                limit, period = current.rate_limit, current.rate_period
                if args.rate_limit is not None:
                    rate = _limit_value(args.rate_limit, parse_rate)
                    limit, period = (rate.limit, rate.period) if rate else (None, None)
                found = await store.type_set_limits(
                    conn, name, concurrency=conc, rate_limit=limit, rate_period=period
                )
        if not found:
            print(f"conveyor types: no job type {name!r}", file=sys.stderr)
            return 1
        t = {t.name: t for t in await store.job_type_list(conn)}[name]
        d = type_dict(t)
        print(
            f"{name}: {'paused' if d['paused'] else 'active'}, concurrency "
            f"{shown(d['concurrency'])}, rate limit {shown(d['rate_limit'])} (limits set by "
            f"the {d['limits_source']}); workers apply it within "
            f"{settings.type_refresh_interval:g} s"
        )
        return 0

    async def go() -> int:
        async with database(settings) as (store, conn):
            if args.action in ("pause", "resume", "limit"):
                return await change(store, conn)
            if router is not None:
                wanted = [t.strip() for t in args.types.split(",")] if args.types else None
                rows = router_types(router, wanted)
                await store.job_type_register_many(conn, rows)
                await register_router_schedules(conn, router, wanted, store=store)
                print(f"registered {', '.join(r.name for r in rows) or 'nothing'}")
                return 0
            known = await store.job_type_list(conn)
            listing(known, args.json, type_dict, lambda t: _line(t, type_dict(t)["rate_limit"]))
            return 0

    # LookupError: --types naming a type the router lacks
    return run(go(), (ValueError, LookupError), named=True)
