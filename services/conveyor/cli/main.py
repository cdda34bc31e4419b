"""The ``conveyor`` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from ..broker import LIBRARY_LOGGERS
from ..core import tracing
from ..core.config import Settings
from ..core.limits import parse_weights
from ..core.logging import configure, say
from ..core.secrets import MaskedStream
from ..store.connect import database_name
from . import dlq, jobs, keys, schedules, types, workflows
from .dev import cmd_dev
from .keys import auth_banner, grant_roles, role_passwords
from .lifecycle import check_health_port, listen_socket, start_with_retry
from .support import CliError, guarded

SERVICES = {"api", "publisher", "sweeper", "worker", "dev"}  # the commands that trace
HEALTH_PORT = "serve /healthz, /readyz and /metrics on this port"
HOST = "address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"
DUTIES = (
    "; with the outbox relay and the maintenance duties, held by one such process at a time "
    "(CONVEYOR_RUN_DUTIES=false: not here)"
)

# Function-local imports below are the services' heavy modules (uvicorn, aio-pika, Alembic, the
# worker): `conveyor --help` and the operator commands do not load them.


# ---------------------------------------------------------------------------- commands


def cmd_migrate(args: argparse.Namespace) -> int:
    from ..store.migrate import MigrationError, migrate

    settings = Settings()
    try:
        created = migrate(settings.database_url, schema=settings.db_schema)
    except OSError as exc:
        raise CliError(f"cannot reach PostgreSQL: {exc}") from None
    except MigrationError as exc:
        raise CliError(str(exc), code=1) from None
    name = database_name(settings.database_url)
    print(
        f"database {name!r} {'created and ' if created else ''}migrated to head "
        f"(schema {settings.db_schema!r})"
    )
    if args.grant_roles or args.create_roles:
        try:
            passwords = role_passwords(os.environ) if args.create_roles else None
            granted = asyncio.run(grant_roles(settings, passwords))
        except Exception as exc:  # no traceback: one line naming what failed
            raise CliError(f"roles: {type(exc).__name__}: {exc}", code=1) from None
        print(f"granted least privileges to {', '.join(granted) or 'no role (none exists)'}")
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    from . import processes

    settings = Settings()
    if args.workers < 1:
        raise CliError("--workers must be at least 1")
    sock = listen_socket(args.host, args.port)  # a port in use: one line, before anything runs
    several = f" ({args.workers} processes)" if args.workers > 1 else ""
    say(
        f"conveyor api listening on http://{args.host}:{args.port}{several}; "
        f"{auth_banner(settings)}",
        "api_listening",
        url=f"http://{args.host}:{args.port}",
        processes=args.workers,
        security=auth_banner(settings),
    )
    if args.workers > 1:
        processes.serve_api_workers(sock, args.workers)
        return 0
    server = processes.api_with_duties(settings, args.host, args.port)
    processes.run(lambda stop: processes.serve_api(server, stop, [sock]))
    return 0


def cmd_publisher(args: argparse.Namespace) -> int:
    from . import processes

    settings = Settings()
    check_health_port(args.health_port)
    processes.run(
        lambda stop: processes.run_publisher(
            settings, stop, maintenance=not args.no_maintenance, health_port=args.health_port
        )
    )
    return 0


def cmd_sweeper(args: argparse.Namespace) -> int:
    from . import processes

    settings = Settings()
    check_health_port(args.health_port)
    processes.run(lambda stop: processes.run_sweeper(settings, stop, health_port=args.health_port))
    return 0


def _types(value: str | None) -> list[str] | None:
    return [t.strip() for t in value.split(",") if t.strip()] if value else None


def cmd_worker(args: argparse.Namespace) -> int:
    from ..core.probes import beside
    from ..worker import Worker
    from ..worker.exiting import adopt_orphans, hard_exit
    from ..worker.health import serve_health
    from . import processes
    from .duties import Duties

    settings = Settings()
    if args.shutdown_grace is not None:
        settings = settings.model_copy(update={"shutdown_grace": args.shutdown_grace})
    router = processes.load_router(args.app)
    try:
        worker = Worker(
            settings,
            router,
            types=_types(args.types),
            concurrency=args.concurrency,
            weights=parse_weights(args.weights),
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None

    port = args.health_port if args.health_port is not None else settings.worker_health_port
    check_health_port(port)

    adopt_orphans()  # a handler's double-forked process stays ours to kill at exit

    duties = Duties(settings, worker.metrics)  # the relay and maintenance, unless turned off

    async def main(stop: asyncio.Event) -> None:
        health = None
        if port is not None:
            health = await serve_health(worker, "0.0.0.0", port, duties=duties.details)
        async with beside(duties):  # they stop after the drain, relaying what it handed back
            await start_with_retry(worker.start, stop, "worker", settings)
            await stop.wait()
            await worker.stop()
        if health is not None:
            health.close()
        # drained: leave now, not through the loop's teardown, which cancels every task left and
        # waits for it (forever for a handler given up on because it ignores its cancellation)
        hard_exit(0)

    code = 0
    try:
        processes.run(main)
    except (CliError, SystemExit):
        raise  # it never started: one line (``guarded``), nothing of the handlers' to abandon
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    # drained: every job's outcome is written or handed back (a late write is fenced). Threads
    # and child processes the handlers left are not the worker's to wait for (see exiting.py)
    hard_exit(code)
    return code


# ---------------------------------------------------------------------------- parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("conveyor")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="conveyor",
        description="Background jobs where accepting a job is a database commit. Settings come "
        "from CONVEYOR_* environment variables (CONVEYOR_DATABASE_URL, CONVEYOR_AMQP_URL, "
        "CONVEYOR_NAMESPACE, CONVEYOR_VISIBILITY_TIMEOUT, ...).",
    )
    p.add_argument("--version", action="version", version=f"conveyor {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("migrate", help="create the database if missing, then alembic upgrade head")
    s.add_argument(
        "--grant-roles",
        action="store_true",
        help="then grant each existing role conveyor_api, conveyor_publisher, "
        "conveyor_worker, conveyor_sweeper only what it uses "
        "(see conveyor roles sql)",
    )
    s.add_argument(
        "--create-roles",
        action="store_true",
        help="first create those four login roles (or set their passwords) from "
        "CONVEYOR_<API|PUBLISHER|WORKER|SWEEPER>_DB_PASSWORD, then grant; needs "
        "CREATEROLE (docker-compose.yml and k8s/base/migrate-job.yaml use it)",
    )
    s.set_defaults(func=cmd_migrate)

    s = sub.add_parser("api", help=f"run the REST API (FastAPI on uvicorn){DUTIES}")
    s.add_argument("--host", default="127.0.0.1", help=HOST)
    s.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    s.add_argument(
        "--workers", type=int, default=1, help="API processes sharing the port (default 1)"
    )
    s.set_defaults(func=cmd_api)

    s = sub.add_parser(
        "publisher",
        help="optional: relay the outbox to RabbitMQ; also runs the maintenance duties "
        "(scheduled jobs, lease recovery, reconciler, retention) unless --no-maintenance",
    )
    s.add_argument(
        "--no-maintenance",
        action="store_true",
        help="relay only; run `conveyor sweeper` separately",
    )
    s.add_argument("--health-port", type=int, help=HEALTH_PORT)
    s.set_defaults(func=cmd_publisher)

    s = sub.add_parser("sweeper", help="run only the maintenance duties")
    s.add_argument(
        "--health-port",
        type=int,
        help="serve /healthz (503 when a duty has not completed a pass within its interval "
        "plus CONVEYOR_MAINTENANCE_DEADLINE), /readyz and /metrics",
    )
    s.set_defaults(func=cmd_sweeper)

    s = sub.add_parser("worker", help=f"run the handlers registered on a JobRouter{DUTIES}")
    s.add_argument("--app", required=True, help="MODULE:ATTR naming a conveyor.JobRouter")
    s.add_argument("--types", help="comma-separated job types to consume (default: all handlers)")
    s.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="jobs run at once; also the prefetch bound (default 16)",
    )
    s.add_argument(
        "--weights",
        help="shares of --concurrency per type, e.g. emails=3,reports=1 "
        "(default: the handlers' weight=, else shared freely)",
    )
    s.add_argument(
        "--shutdown-grace",
        type=float,
        default=None,
        help="seconds in-flight jobs get to finish on SIGTERM (default "
        "CONVEYOR_SHUTDOWN_GRACE or 25)",
    )
    s.add_argument("--health-port", type=int, help=HEALTH_PORT)
    s.set_defaults(func=cmd_worker)

    s = sub.add_parser("dev", help="API + publisher + maintenance + worker in one process")
    s.add_argument("--app", required=True, help="MODULE:ATTR naming a conveyor.JobRouter")
    s.add_argument("--host", default="127.0.0.1", help=HOST + "; with auth disabled, loopback only")
    s.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    s.add_argument(
        "--concurrency", type=int, default=16, help="the worker's jobs run at once (default 16)"
    )
    s.set_defaults(func=cmd_dev)
    for group in (jobs, dlq, types, keys, schedules, workflows):
        group.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    if not isinstance(sys.stderr, MaskedStream):  # no credential in any message or traceback
        sys.stderr = MaskedStream(sys.stderr)
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
        configure(settings.log_level, settings.log_format, quiet=(*LIBRARY_LOGGERS, "alembic"))
    except ValidationError:  # reported below, when the command reads its settings
        configure(quiet=(*LIBRARY_LOGGERS, "alembic"))
    if args.command in SERVICES:  # only OTEL_* variables turn it on (core/tracing.py)
        tracing.configure(f"conveyor-{args.command}")
    try:
        return guarded(lambda: int(args.func(args)), args.command)
    except ValidationError as exc:  # a CONVEYOR_* setting: one line, not a traceback
        first = exc.errors()[0]
        name = "CONVEYOR_" + "_".join(str(p) for p in first["loc"]).upper()
        message = str(first["msg"]).removeprefix("Value error, ")
        say(f"conveyor: invalid {name}: {message}", level=logging.ERROR)
        return 2
