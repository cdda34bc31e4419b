"""``conveyor types list|register``: the job types the API accepts (see ``job_types``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from .core.config import Settings


def add_parser(sub: Any) -> None:
    s = sub.add_parser("types", help="list the known job types, or register a router's types")
    actions = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="the types workers registered, with their defaults")
    r = actions.add_parser(
        "register", help="register a router's types without running a worker (a deploy step)"
    )
    r.add_argument("--app", required=True, help="MODULE:ATTR naming a conveyor.JobRouter")
    r.add_argument("--types", help="comma-separated subset (default: every handler)")
    s.set_defaults(func=cmd_types)


def cmd_types(args: argparse.Namespace) -> int:
    from . import services
    from .job_types import router_types
    from .schedule_ops import register_router_schedules
    from .store import for_schema
    from .store.connect import create_pool

    settings = Settings()
    store = for_schema(settings.db_schema)
    router = services.load_router(args.app) if args.action == "register" else None

    async def go() -> int:
        pool = await create_pool(settings.database_url, application_name="conveyor-cli")
        try:
            async with pool.acquire() as conn:
                if router is not None:
                    wanted = [t.strip() for t in args.types.split(",")] if args.types else None
                    rows = router_types(router, wanted)
                    await store.job_type_register_many(conn, rows)
                    await register_router_schedules(conn, router, wanted, store=store)
                    print(f"registered {', '.join(r.name for r in rows) or 'nothing'}")
                    return 0
                for t in await store.job_type_list(conn):
                    delays = ",".join(map(str, t.retry_delays)) or "-"
                    seen = f"{t.last_seen:%Y-%m-%d %H:%M:%S}"
                    print(f"{t.name:<32} max_retries={t.max_retries} timeout={t.timeout_seconds}"
                          f" retry_delays={delays} last_seen={seen}")  # fmt: skip
                return 0
        finally:
            await pool.close()

    try:
        return asyncio.run(go())
    except Exception as exc:
        print(f"conveyor types: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
