"""``conveyor dlq list|redrive|purge``: the dead-letter queue, for operators (see
``maintenance/deadletters.py``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from typing import Any

import orjson

from .core.config import Settings


def add_parser(sub: Any) -> None:
    s = sub.add_parser("dlq", help="list, redrive or purge the dead-letter queue")
    dlq = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    d = dlq.add_parser("list", help="print dead letters (they stay in the queue)")
    d.add_argument("--limit", type=int, default=100)
    for name, help_ in (("redrive", "re-queue the jobs of matching dead letters"),
                        ("purge", "delete matching dead letters (jobs stay FAILED)")):  # fmt: skip
        d = dlq.add_parser(name, help=help_)
        d.add_argument("--id", action="append", help="a job id (repeatable)")
        d.add_argument("--type", help="every dead letter of this job type")
        d.add_argument("--all", action="store_true", help="every dead letter")
    s.set_defaults(func=cmd_dlq)


def _print(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


def cmd_dlq(args: argparse.Namespace) -> int:
    from .broker.inspect import Inspector
    from .broker.topology import Topology
    from .maintenance import deadletters as dl
    from .store import for_schema
    from .store.connect import create_pool

    settings = Settings()
    ids = {uuid.UUID(i) for i in (args.id or [])} if args.action != "list" else set()
    if args.action != "list" and not (ids or args.type or args.all):
        print(
            "conveyor dlq: say which: --id ID (repeatable), --type TYPE or --all", file=sys.stderr
        )
        return 2

    async def go() -> int:
        inspector = Inspector(
            settings.amqp_url,
            Topology(settings.namespace, settings.queue_type),
            name="conveyor-dlq",
        )
        pool = await create_pool(
            settings.database_url, application_name="conveyor-dlq", max_size=2,
            pooler=settings.db_pooler,
        )  # fmt: skip
        try:
            store = for_schema(settings.db_schema)
            if args.action == "list":
                seen = await dl.scan(inspector, pool, store, lambda _: "keep", limit=args.limit)
                _print([d.as_dict() for d, _ in seen])
                return 0
            match = dl.selector(ids, args.type, args.all)
            decide = (
                dl.redrive_decision(match) if args.action == "redrive" else dl.purge_decision(match)
            )
            seen = await dl.scan(inspector, pool, store, decide)
            summary: dict[str, int] = {}
            for _, decision in seen:
                summary[decision] = summary.get(decision, 0) + 1
            _print({"scanned": len(seen), **summary})
            return 0
        finally:
            await inspector.close()
            await pool.close()

    return asyncio.run(go())
