"""``conveyor dlq list|redrive|purge``: the dead-letter queue, for operators (see
``maintenance/deadletters.py``). A bulk purge (``--type``, ``--all``) first counts what it
would drop and asks (or takes ``--yes``)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ..core.config import Settings
from .support import CliError, check_broker, confirm, database, json_doc, list_by_default, listing


def add_parser(sub: Any) -> None:
    s = sub.add_parser("dlq", help="list, redrive or purge the dead-letter queue")
    dlq = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = dlq.add_parser(
        "list",
        help="print the dead letters whose job is still FAILED at the "
        "attempt they recorded, oldest first (they stay in the queue); drops the "
        "stale ones (redriven, purged or failed again since, from anywhere)",
    )
    ls.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    ls.add_argument("--json", action="store_true", help="one JSON object per letter (JSON Lines)")
    for name, help_ in (
        ("redrive", "re-queue the jobs of matching dead letters"),
        ("purge", "delete matching dead letters (jobs stay FAILED)"),
    ):
        d = dlq.add_parser(name, help=help_)
        d.add_argument("--id", action="append", help="a job id (repeatable)")
        d.add_argument("--type", help="every dead letter of this job type")
        d.add_argument("--all", action="store_true", help="every dead letter")
        if name == "purge":
            d.add_argument(
                "--yes", action="store_true", help="purge by --type or --all without asking"
            )
    s.set_defaults(func=cmd_dlq)
    list_by_default(s, dlq, ls)


def _line(d: dict[str, Any]) -> str:
    error = (d["error"] or d["raw"] or "").strip().splitlines()
    return (
        f"{d['job_id'] or '(not a job)':<36}  {d['type'] or '-':<24} "
        f"{d['attempt'] if d['attempt'] is not None else '-':>7}  {d['status'] or '-':<11} "
        f"{'stale' if d['stale'] else '':<5}  {error[-1][:100] if error else ''}"
    )


def cmd_dlq(args: argparse.Namespace) -> int:
    from ..broker.inspect import Inspector  # aio-pika: imported by the commands that use it
    from ..broker.topology import Topology
    from ..maintenance import deadletters as dl

    settings = Settings()
    try:
        ids = {uuid.UUID(i) for i in (args.id or [])} if args.action != "list" else set()
    except ValueError as exc:
        raise CliError(f"--id: {exc}") from None
    if args.action != "list" and not (ids or args.type or args.all):
        raise CliError("say which: --id ID (repeatable), --type TYPE or --all")
    if args.action == "list" and args.limit < 1:
        raise CliError("--limit must be at least 1")
    bulk = args.action == "purge" and (args.all or args.type is not None)

    async def go() -> int:
        await check_broker(settings)
        topology = Topology(settings.namespace, settings.queue_type)
        inspector = Inspector(settings.amqp_url, topology, name="conveyor-dlq")
        try:
            async with database(settings, "conveyor-dlq") as (store, conn):
                pool = _OneConnection(conn)
                if args.action == "list":
                    # a stale letter stays stale (attempts only grow): drop it as we pass, so
                    # a redrive from the dashboard or the API leaves nothing behind here
                    seen = await dl.scan(
                        inspector,
                        pool,
                        store,
                        lambda d: "drop" if d.stale else "keep",
                        limit=args.limit,
                    )
                    stale = sum(1 for _, decision in seen if decision == "drop")
                    seen = [(letter, d) for letter, d in seen if d == "keep"]
                    if stale:
                        print(
                            f"dropped {stale} stale dead letter(s): their jobs were redriven, "
                            "purged or failed again since",
                            file=sys.stderr,
                        )
                    if not args.json:
                        print(
                            f"{'job':<36}  {'type':<24} {'attempt':>7}  {'status':<11} "
                            f"{'':<5}  error"
                        )
                    listing([letter.as_dict() for letter, _ in seen], args.json, dict, _line)
                    return 0
                match = dl.selector(ids, args.type, args.all)
                if bulk and not args.yes:
                    counted = await dl.scan(inspector, pool, store, lambda _: "keep")
                    n = sum(1 for d, _ in counted if d.stale or match(d))
                    what = "every dead letter" if args.all else f"type {args.type!r}"
                    if n and not confirm(
                        f"Purge {n} of {len(counted)} dead letters ({what}; the jobs stay FAILED)?",
                        yes=False,
                    ):
                        print("nothing purged", file=sys.stderr)
                        return 1
                decide = dl.redrive_decision if args.action == "redrive" else dl.purge_decision
                seen = await dl.scan(inspector, pool, store, decide(match))
                json_doc({"scanned": len(seen), **collections.Counter(d for _, d in seen)})
                return 0
        finally:
            await inspector.close()

    return asyncio.run(go())


class _OneConnection:
    """``pool.acquire()`` over the command's one connection (what ``deadletters.scan`` takes)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        yield self.conn
