"""``conveyor dev``: API, publisher (with the maintenance duties) and a worker in one process,
on one metrics registry, migrating first; without keys on loopback only, whole tracebacks
shown (``dev_auth``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from ..core.config import Settings
from ..core.logging import say
from .keys import auth_banner
from .lifecycle import listen_socket, start_with_retry
from .support import CliError


def cmd_dev(args: argparse.Namespace) -> int:
    # the services, uvicorn, aio-pika, Alembic: imported when the command runs, not for --help
    from ..core.metrics import Metrics
    from ..store.migrate import MigrationError, migrate
    from ..worker import Worker
    from . import processes

    settings, refusal = dev_auth(Settings(), args.host)
    if refusal:
        say(f"conveyor dev: {refusal}", level=logging.ERROR)
        return 2
    router = processes.load_router(args.app)
    if not router.handlers:  # before the port, the database or the broker, as `worker` does
        say("conveyor dev: the router has no handlers", level=logging.ERROR)
        return 2
    # the port first: in use, it is one line and exit 2 before anything starts
    sock = listen_socket(args.host, args.port, make=True)
    problem = asyncio.run(processes.preflight(settings))
    if problem:
        say(f"conveyor dev: {problem}", level=logging.ERROR)
        return 2
    try:
        migrate(settings.database_url, schema=settings.db_schema)
    except MigrationError as exc:
        say(f"conveyor dev: {exc}", level=logging.ERROR)
        return 1
    metrics = Metrics()  # one registry: the API's /metrics shows the worker and publisher too
    server = processes.api_server(settings, args.host, args.port, metrics=metrics)
    worker = Worker(settings, router, concurrency=args.concurrency, metrics=metrics)
    url = f"http://{args.host}:{args.port}"

    async def main(stop: asyncio.Event) -> None:
        await start_with_retry(worker.start, stop, "worker", settings)
        parts = {
            asyncio.create_task(processes.serve_api(server, stop, [sock])): "API",
            asyncio.create_task(processes.run_publisher(settings, stop, metrics=metrics)): (
                "publisher"
            ),
        }
        try:
            while not server.started and not any(t.done() for t in parts):  # noqa: ASYNC110
                await asyncio.sleep(0.02)  # the banner only once the API listens
            if server.started:
                banner(url, auth_banner(settings, dev=True), router.types)
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([*parts, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
        finally:  # every part stops when one ends: the process never runs without its API
            stop.set()
            await worker.stop()
            results = await asyncio.gather(*parts, return_exceptions=True)
        for task, result in zip(parts, results, strict=True):
            if isinstance(result, CliError | SystemExit):
                raise result
            if isinstance(result, BaseException):
                raise CliError(f"the {parts[task]} stopped: {type(result).__name__}: {result}")

    processes.run(main)
    return 0


def _unset(settings: Settings, **defaults: object) -> Settings:
    """``settings`` with ``defaults`` where no CONVEYOR_* variable sets them."""
    unset = {k: v for k, v in defaults.items() if f"CONVEYOR_{k.upper()}" not in os.environ}
    return settings.model_copy(update=unset)


def dev_auth(settings: Settings, host: str) -> tuple[Settings, str | None]:
    """``conveyor dev``'s laptop defaults, each unless its variable is set: auth disabled (and
    then loopback only), a failed attempt's whole traceback in the log, and with auth disabled
    in the API's answers and on the job page too. Returns the settings, or a refusal."""
    from .processes import loopback  # uvicorn: imported when the command runs

    settings = _unset(settings, auth="disabled", log_tracebacks=True)  # `conveyor api`: keys
    if settings.auth == "disabled":  # loopback: only this machine reads them
        settings = _unset(settings, api_expose_tracebacks=True)
    if settings.auth == "disabled" and not loopback(host):
        return settings, (
            f"refusing --host {host} with auth disabled: bind 127.0.0.1 (the default), or set "
            "CONVEYOR_AUTH=required and use API keys"
        )
    return settings, None


def banner(url: str, security: str, types: list[str]) -> None:
    """What a new user reads first: the URL, the security mode, a curl line to try (one JSON
    object when ``CONVEYOR_LOG_FORMAT=json``)."""
    submit = (
        f"curl -s -X POST {url}/jobs -H 'content-type: application/json' "
        f"""-d '{{"type": "{types[0]}", "payload": {{"name": "world"}}}}'"""
    )
    show = f"curl -s {url}/jobs/<id from above>"
    text = (
        f"\nConveyor is running: API {url}  (docs {url}/docs)\nSecurity: {security}\n"
        f"Handlers: {', '.join(types)}\nTry:\n  {submit}\n  {show}\nCtrl-C stops it.\n"
    )
    say(
        text,
        "dev_running",
        url=url,
        docs=f"{url}/docs",
        security=security,
        handlers=types,
        examples=[submit, show],
    )
