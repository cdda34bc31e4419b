"""``conveyor dev``: API, publisher (with the maintenance duties) and a worker in one process,
on one metrics registry, migrating first; without keys on loopback only (``cli_keys.dev_auth``)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from .core.config import Settings


def cmd_dev(args: argparse.Namespace) -> int:
    from . import services
    from .cli_keys import auth_banner, dev_auth
    from .core.metrics import Metrics
    from .store.legacy import MigrationError
    from .store.migrate import migrate
    from .worker import Worker

    settings, refusal = dev_auth(Settings(), args.host)
    if refusal:
        print(f"conveyor dev: {refusal}", file=sys.stderr)
        return 2
    router = services.load_router(args.app)
    problem = asyncio.run(services.preflight(settings))
    if problem:
        print(f"conveyor dev: {problem}", file=sys.stderr)
        return 2
    try:
        migrate(settings.database_url, schema=settings.db_schema)
    except MigrationError as exc:
        print(f"conveyor dev: {exc}", file=sys.stderr)
        return 1
    metrics = Metrics()  # one registry: the API's /metrics shows the worker and publisher too
    server = services.api_server(settings, args.host, args.port, metrics=metrics)
    worker = Worker(settings, router, concurrency=args.concurrency, metrics=metrics)
    first = router.types[0]
    url = f"http://{args.host}:{args.port}"

    async def main(stop: asyncio.Event) -> None:
        await worker.start()
        tasks = [
            asyncio.create_task(services.serve_api(server, stop)),
            asyncio.create_task(services.run_publisher(settings, stop, metrics=metrics)),
        ]
        while not server.started and not tasks[0].done():  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # print the curl line only once the API listens
        if tasks[0].done():
            await tasks[0]  # uvicorn failed to start (port taken): surface why
            return
        print(
            f"\nConveyor is running: API {url}  (docs {url}/docs)\n"
            f"Security: {auth_banner(settings, dev=True)}\n"
            f"Handlers: {', '.join(router.types)}\n"
            "Try:\n"
            f"  curl -s -X POST {url}/jobs -H 'content-type: application/json' "
            f"""-d '{{"type": "{first}", "payload": {{"name": "world"}}}}'\n"""
            f"  curl -s {url}/jobs/<id from above>\n"
            "Ctrl-C stops it.\n",
            file=sys.stderr,
            flush=True,
        )
        await stop.wait()
        await worker.stop()
        await asyncio.gather(*tasks)

    services.run(main)
    return 0
