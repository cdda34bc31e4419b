"""``conveyor types list|register|pause|resume|limit|partitions|partition``: the job types the
API accepts (see ``job_types``), their pause flag and fleet-wide limits (``store/types.py``),
and the partition keys of a type with an operator's settings of each (the same functions as
``GET /types/{type}/partitions`` and ``PUT /types/{type}/partitions/{key}``:
``api/partitions.py``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..core.config import Settings
from ..core.errors import JobNotFound
from ..core.limits import check_concurrency, parse_rate
from ..jobs.types import register_router_schedules, router_types
from ..store import Store
from .support import CliError, database, json_line, list_by_default, listing, run, shown, when


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
    keys = actions.add_parser(
        "partitions", help="a type's partition keys: waiting, admitted, running, oldest wait"
    )
    keys.add_argument("type", help="the job type")
    keys.add_argument(
        "--limit", type=int, default=100, help="keys per page, oldest wait first (default 100)"
    )
    keys.add_argument("--cursor", help="the page after this cursor (printed after each page)")
    keys.add_argument("--all", action="store_true", help="follow every page")
    keys.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per key, as GET /types/{type}/partitions (JSON Lines)",
    )
    key = actions.add_parser(
        "partition",
        help="pause, resume or limit one partition key (kept until removed); "
        "without an option: show it",
    )
    key.add_argument("type", help="the job type")
    key.add_argument("key", help="the partition key (as `conveyor types partitions` lists it)")
    pause = key.add_mutually_exclusive_group()
    pause.add_argument(
        "--pause", action="store_true", help="admit none of the key's jobs (running ones go on)"
    )
    pause.add_argument("--resume", action="store_true", help="admit the key's jobs again")
    key.add_argument(
        "--concurrency",
        metavar="N|none",
        help="at most N of the key's jobs admitted or running at once; "
        "'none': the type's partition_concurrency again",
    )
    key.add_argument(
        "--json", action="store_true", help="the key as PUT /types/{type}/partitions/{key} answers"
    )
    s.set_defaults(func=cmd_types)
    list_by_default(s, actions, ls)


def _limit_value(text: str | None, parse: Any) -> Any:
    return None if text is None or text.lower() == "none" else parse(text)


def _line(t: Any, d: dict[str, Any]) -> str:
    delays = ",".join(map(str, t.retry_delays)) or "-"
    timeout = "-" if t.timeout_seconds is None else f"{t.timeout_seconds:g}s"
    partitioned = ""
    if t.partition is not None:  # only a partitioned type says how
        by = ",".join(d["partition_by"] or ()) or "-"
        partitioned = (
            f" partition_by={by} partition_concurrency={shown(d['partition_concurrency'])}"
            f" partition_rate_limit={shown(d['partition_rate_limit'])}"
            f" ordered={shown(d['ordered'])}"
        )
    return (
        f"{t.name:<32} {'PAUSED' if t.paused else 'active':<6} concurrency={shown(t.concurrency)}"
        f" rate_limit={shown(d['rate_limit'])} running={t.running}{partitioned}"
        f" max_retries={shown(t.max_retries)} timeout={timeout}"
        f" retry_delays={delays} last_seen={when(t.last_seen)}"
    )


def _printable(key: str) -> str:
    """A key for a table: control characters escaped, the rest as it is."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)


def _wait(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


COLUMNS = ("KEY", "WAITING", "ADMITTED", "RUNNING", "OLDEST WAIT", "LIMIT", "PAUSED")


def _table(rows: list[dict[str, Any]], header: bool) -> list[str]:
    cells = [
        (_printable(r["key"]), str(r["waiting"]), str(r["admitted"]), str(r["running"]),
         _wait(r["oldest_wait_seconds"]), shown(r["limit"]), shown(r["paused"]))
        for r in rows
    ]  # fmt: skip
    width = min(40, max([len(COLUMNS[0]), *(len(c[0]) for c in cells)]))
    lines = [COLUMNS] if header else []
    return [
        f"{c[0]:<{width}} {c[1]:>8} {c[2]:>8} {c[3]:>8} {c[4]:>11} {c[5]:>6} {c[6]:>6}"
        for c in [*lines, *cells]
    ]


async def _partitions(args: argparse.Namespace, store: Store, conn: Any) -> int:
    from ..api.partitions import MAX_PAGE, list_partitions

    if not 1 <= args.limit <= MAX_PAGE:
        raise CliError(f"--limit must be from 1 to {MAX_PAGE}")
    cursor, first = args.cursor, True
    while True:
        page = await list_partitions(store, conn, args.type, args.limit, cursor)
        if args.json:
            listing(page["partitions"], True, lambda r: r, str)
        else:
            for line in _table(page["partitions"], header=first):
                sys.stdout.write(line + "\n")
        first, cursor = False, page["next_cursor"]
        if cursor is None:
            return 0
        if not args.all:
            print(f"more: --cursor {cursor}", file=sys.stderr)
            return 0
        sys.stdout.flush()  # a page at a time: `| head` stops the walk early


async def _partition(args: argparse.Namespace, store: Store, conn: Any) -> int:
    from ..api.partitions import set_partition
    from ..store.types import UNCHANGED

    concurrency = UNCHANGED
    if args.concurrency is not None:
        concurrency = _limit_value(args.concurrency, _integer)
    paused = True if args.pause else False if args.resume else None
    async with conn.transaction():
        view = await set_partition(
            store, conn, args.type, args.key, concurrency=concurrency, paused=paused
        )
    if args.json:
        json_line(view)
        return 0
    limit = shown(view["limit"])
    if view["concurrency"] is not None:
        limit += " (operator's)"
    print(
        f"{args.type} key {_printable(view['key'])}: {'paused' if view['paused'] else 'active'}, "
        f"limit {limit}, waiting {view['waiting']}, admitted {view['admitted']}, running "
        f"{view['running']}, oldest wait {_wait(view['oldest_wait_seconds'])}"
    )
    return 0


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number (or 'none')") from None


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
            if args.action == "partitions":
                return await _partitions(args, store, conn)
            if args.action == "partition":
                return await _partition(args, store, conn)
            if router is not None:
                wanted = [t.strip() for t in args.types.split(",")] if args.types else None
                rows = router_types(router, wanted)
                await store.job_type_register_many(conn, rows)
                await register_router_schedules(conn, router, wanted, store=store)
                print(f"registered {', '.join(r.name for r in rows) or 'nothing'}")
                return 0
            known = await store.job_type_list(conn)
            listing(known, args.json, type_dict, lambda t: _line(t, type_dict(t)))
            return 0

    # LookupError: --types naming a type the router lacks
    try:
        return run(go(), (ValueError, LookupError), named=True)
    except JobNotFound as exc:  # an unknown type: the command ran and found none
        print(f"conveyor types: {exc}", file=sys.stderr)
        return 1
