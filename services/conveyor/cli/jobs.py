"""``conveyor jobs show|list|cancel|retry``: jobs for operators. ``list`` pages like
``GET /jobs`` (newest first, keyset ``--cursor``; ``--all`` follows every page); ``--json``
prints what the API answers, one JSON object per line (JSON Lines; ``show`` adds the job's
``attempts`` as ``GET /jobs/{id}/attempts`` lists them)."""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

import orjson

from ..api.resource import resource as job_resource
from ..core.config import Settings
from ..core.jobs import Status
from ..store import JobRow, Store
from .support import database, json_doc, json_line, list_by_default, pages, run, when
from .support import job_id as parse_job_id

STATUSES = [s.value for s in Status]


def add_parser(sub: Any) -> None:
    s = sub.add_parser("jobs", help="show, list, cancel or retry jobs")
    jobs = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_ in (
        ("show", "print one job and its attempts"),
        ("cancel", "cancel a job"),
        ("retry", "re-queue a FAILED or CANCELLED job"),
    ):
        j = jobs.add_parser(name, help=help_)
        j.add_argument("id", help="the job's id (a UUID, as `conveyor jobs list` prints it)")
        if name == "show":
            j.add_argument(
                "--json", action="store_true", help="the job and its attempts as one JSON line"
            )
    j = jobs.add_parser("list", help="list jobs, newest first, a page at a time")
    j.add_argument("--type", help="only jobs of this type")
    j.add_argument(
        "--status", type=str.upper, choices=STATUSES, help="only jobs in this status (any case)"
    )
    j.add_argument("--limit", type=int, default=50, help="jobs per page (default 50)")
    j.add_argument("--cursor", help="the page after this cursor (printed after each page)")
    j.add_argument("--all", action="store_true", help="follow every page")
    j.add_argument("--json", action="store_true", help="one JSON object per job (JSON Lines)")
    s.set_defaults(func=cmd_jobs)
    list_by_default(s, jobs, j)


def _text(row: Any, attempts: list[dict[str, Any]]) -> str:
    retries = f"{row.retry_count} of {row.max_retries if row.max_retries is not None else '?'}"
    fields = [
        ("id", row.id),
        ("type", row.job_type),
        ("status", row.status),
        ("priority", row.priority),
        ("attempts", f"{row.attempts} (retries used: {retries})"),
        ("created", when(row.created_at)),
        ("run at", when(row.run_at)),
        ("started", when(row.started_at)),
        ("finished", when(row.finished_at)),
        ("worker", row.worker_id or "-"),
        ("payload", orjson.dumps(row.payload).decode()),
        ("result", orjson.dumps(row.result).decode() if row.result is not None else "-"),
    ]
    lines = [f"{k:<10} {v}" for k, v in fields]
    if row.last_error:
        lines.append("last error:")
        lines += ["  " + line for line in row.last_error.rstrip().splitlines()]
    lines.append(f"{'#':>3}  {'outcome':<13} {'worker':<24} {'started':<23}  {'seconds':>8}  error")
    for a in attempts:
        error = (a["error"] or "").strip().splitlines()
        seconds = a["duration_seconds"]
        lines.append(
            f"{a['attempt']:>3}  {a['outcome'] or 'running':<13} {a['worker_id'] or '-':<24} "
            f"{when(a['started_at']):<23}  {'-' if seconds is None else f'{seconds:.3f}':>8}  "
            f"{error[-1][:100] if error else ''}".rstrip()
        )
    return "\n".join(lines)


def _list_line(r: Any) -> str:
    return (
        f"{r.id}  {r.job_type:<24} {r.status:<12} attempts={r.attempts}"
        f"  created {when(r.created_at)}"
    )


def cmd_jobs(args: argparse.Namespace) -> int:
    from ..api.attempts import attempt_dict  # FastAPI: imported by the commands that use it

    settings = Settings()

    def resource(row: JobRow) -> dict[str, Any]:
        # the API's own rendering (orjson writes its times as +00:00, as the API does)
        return job_resource(row, tracebacks=True)

    async def go() -> int:
        async with database(settings) as (store, conn):
            if args.action != "list":
                return await one(store, conn, parse_job_id(args.id))
            return await pages(
                args,
                lambda after, n: store.job_list(
                    conn, job_type=args.type, status=args.status, after=after, limit=n
                ),
                resource,
                _list_line,
            )

    async def one(store: Store, conn: Any, job_id: uuid.UUID) -> int:
        attempts: list[dict[str, Any]] = []
        if args.action == "show":
            row = await store.job_get(conn, job_id)
            attempts = [attempt_dict(a) for a in await store.job_attempt_list(conn, job_id) or []]
        elif args.action == "cancel":
            async with conn.transaction():
                ok = await store.job_cancel(conn, job_id)
                row = await store.job_get(conn, job_id)
            if row is not None and not ok:
                print(f"job {job_id} is {row.status}: nothing to cancel", file=sys.stderr)
                return 1
        else:  # retry
            async with conn.transaction():
                ok = bool(await store.job_redrive(conn, [job_id]))
                await store.outbox_notify(conn)
                row = await store.job_get(conn, job_id)
            if row is not None and not ok:
                print(
                    f"job {job_id} is {row.status}: only FAILED or CANCELLED jobs can be retried",
                    file=sys.stderr,
                )
                return 1
        if row is None:
            print(f"no job {job_id}", file=sys.stderr)
            return 1
        if args.action == "show" and not args.json:
            print(_text(row, attempts))
        elif args.action == "show":
            json_line({**resource(row), "attempts": attempts})
        else:
            json_doc(resource(row))
        return 0

    if args.action != "list":
        parse_job_id(args.id)  # a malformed id: one line, before any connection
    return run(go())  # a ValueError: a malformed cursor
