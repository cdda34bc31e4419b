"""``conveyor jobs show|list|cancel|retry``: one job at a time, for operators."""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from typing import Any

import orjson

from .core.config import Settings


def _print(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


def add_parser(sub: Any) -> None:
    s = sub.add_parser("jobs", help="show, list, cancel or retry jobs")
    jobs = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_ in (("show", "print one job"), ("cancel", "cancel a job"),
                        ("retry", "re-queue a FAILED or CANCELLED job")):  # fmt: skip
        j = jobs.add_parser(name, help=help_)
        j.add_argument("id")
    j = jobs.add_parser("list", help="list jobs, newest first")
    j.add_argument("--type")
    j.add_argument("--status", choices=[
        "PENDING", "SCHEDULED", "IN_PROGRESS", "RETRYING", "COMPLETED", "FAILED", "CANCELLED",
    ])  # fmt: skip
    j.add_argument("--limit", type=int, default=50)
    s.set_defaults(func=cmd_jobs)


async def _with_pool(fn: Any) -> Any:
    from .store.connect import create_pool

    settings = Settings()
    pool = await create_pool(
        settings.database_url, application_name="conveyor-cli", max_size=1,
        pooler=settings.db_pooler,
    )  # fmt: skip
    try:
        async with pool.acquire() as conn:
            return await fn(conn)
    finally:
        await pool.close()


def cmd_jobs(args: argparse.Namespace) -> int:
    from .api.attempts import attempt_dict
    from .api.models import JobResource
    from .store import JobRow, for_schema

    store = for_schema(Settings().db_schema)

    def resource(row: JobRow) -> dict[str, Any]:
        return JobResource.from_row(row).model_dump(mode="json")

    async def go(conn: Any) -> int:
        if args.action == "list":
            rows = await store.job_list(
                conn, job_type=args.type, status=args.status, after=None, limit=args.limit
            )
            for r in rows:
                print(f"{r.id}  {r.job_type:<24} {r.status:<12} attempts={r.attempts}"
                      f"  created={r.created_at:%Y-%m-%d %H:%M:%S}")  # fmt: skip
            return 0
        job_id = uuid.UUID(args.id)
        extra: dict[str, Any] = {}
        if args.action == "show":
            row = await store.job_get(conn, job_id)
            attempts = await store.job_attempt_list(conn, job_id) or []
            extra["attempts"] = [attempt_dict(a) for a in attempts]
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
                print(f"job {job_id} is {row.status}: only FAILED or CANCELLED jobs can be "
                      "retried", file=sys.stderr)  # fmt: skip
                return 1
        if row is None:
            print(f"no job {job_id}", file=sys.stderr)
            return 1
        _print({**resource(row), **extra})
        return 0

    try:
        return int(asyncio.run(_with_pool(go)))
    except ValueError as exc:
        print(f"conveyor jobs: {exc}", file=sys.stderr)
        return 2
