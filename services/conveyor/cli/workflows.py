"""``conveyor workflows list|show|cancel``: workflows for operators, read from the database as
``GET /workflows`` reads them. ``list`` pages newest first (keyset ``--cursor``; ``--all``
follows every page); ``--json`` prints what the API answers, one JSON object per line."""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

from ..core.config import Settings
from ..store import Store
from ..store.schema import WORKFLOW_STATUSES
from ..store.workflows import WorkflowRow
from .support import CliError, database, json_line, list_by_default, pages, run, when


def parse_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise CliError(
            f'"{text}" is not a workflow id (a UUID, as `conveyor workflows list` prints them)'
        ) from None


def add_parser(sub: Any) -> None:
    s = sub.add_parser("workflows", help="list, show or cancel workflows")
    wf = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_ in (
        ("show", "print one workflow and each of its jobs"),
        ("cancel", "cancel every unfinished job of a workflow"),
    ):
        w = wf.add_parser(name, help=help_)
        w.add_argument("id", help="the workflow's id (as `conveyor workflows list` prints it)")
        w.add_argument("--json", action="store_true", help="the workflow as one JSON line")
    w = wf.add_parser("list", help="list workflows, newest first, a page at a time")
    w.add_argument(
        "--status",
        type=str.upper,
        choices=WORKFLOW_STATUSES,
        help="only workflows in this status (any case)",
    )
    w.add_argument("--name", help="only workflows of this name")
    w.add_argument("--limit", type=int, default=50, help="workflows per page (default 50)")
    w.add_argument("--cursor", help="the page after this cursor (printed after each page)")
    w.add_argument("--all", action="store_true", help="follow every page")
    w.add_argument("--json", action="store_true", help="one JSON object per workflow")
    s.set_defaults(func=cmd_workflows)
    list_by_default(s, wf, w)


def _counts(c: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in c.items() if k != "jobs" and v)


def _text(wf: dict[str, Any]) -> str:
    lines = [
        f"{'id':<10} {wf['id']}",
        f"{'name':<10} {wf['name']}",
        f"{'status':<10} {wf['status']} (on failure: {wf['on_failure']})",
        f"{'created':<10} {when(wf['created_at'])}",
        f"{'finished':<10} {when(wf['finished_at'])}",
        f"{'jobs':<10} {wf['counts']['jobs']}: {_counts(wf['counts'])}",
        f"{'key':<20} {'job id':<36}  {'type':<20} {'status':<12} waits for",
    ]
    for j in wf["jobs"]:
        after = ", ".join(j["after"]) or "-"
        lines.append(f"{j['key']:<20} {j['id']!s:<36}  {j['type']:<20} {j['status']:<12} {after}")
        if j["last_error"]:
            lines.append(f"{'':<20} {j['last_error'][:100]}")
    return "\n".join(lines)


def cmd_workflows(args: argparse.Namespace) -> int:
    from ..api.workflows import summary, workflow_resource
    from ..workflows import cancel_workflow, get_workflow

    settings = Settings()

    def line(r: WorkflowRow) -> str:
        return (
            f"{r.id}  {r.name[:24]:<24} {r.status:<10} jobs={r.jobs} "
            f"{_counts(summary(r)['counts'])}  created {when(r.created_at)}"
        )

    async def one(store: Store, conn: Any) -> int:
        workflow_id = parse_id(args.id)
        if args.action == "cancel":
            try:
                async with conn.transaction():
                    n = await cancel_workflow(conn, workflow_id, schema=store.schema)
            except LookupError:
                n = None
            if n is not None and not args.json:
                print(f"cancelled {n} jobs of workflow {workflow_id}", file=sys.stderr)
        found = await get_workflow(conn, workflow_id, schema=store.schema)
        if found is None:
            print(f"no workflow {workflow_id}", file=sys.stderr)
            return 1
        wf = workflow_resource(*found)
        if args.json:
            json_line(wf)
        else:
            print(_text(wf))
        return 0

    async def go() -> int:
        async with database(settings) as (store, conn):
            if args.action != "list":
                return await one(store, conn)
            return await pages(
                args,
                lambda before, n: store.workflow_page(
                    conn, status=args.status, name=args.name, before=before, limit=n
                ),
                summary,
                line,
            )

    if args.action != "list":
        parse_id(args.id)  # a malformed id: one line, before any connection
    return run(go())  # a ValueError: a malformed cursor
