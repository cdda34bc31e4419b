"""Running the services: signal handling, uvloop, API server, and the combined ``dev`` mode.
This is the one bootstrap place where settings meet real adapters."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import ipaddress
import logging
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn

from ..broker import LIBRARY_LOGGERS
from ..core import tracing
from ..core.config import Settings
from ..core.logging import configure, event
from ..core.metrics import Metrics
from ..core.probes import Background, serve_probes
from ..core.secrets import MaskedStream, mask_url
from ..jobs.router import JobRouter
from ..store.connect import check_server
from .lifecycle import install_signals, start_with_retry
from .support import CliError

log = logging.getLogger("conveyor")
# every API server: uvicorn's loggers go to ours (one format: CONVEYOR_LOG_FORMAT), no access log
_UVICORN: dict[str, Any] = {
    "lifespan": "on",
    "log_level": "warning",
    "log_config": None,
    "access_log": False,
    "timeout_graceful_shutdown": 10,
}


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: our stop event drives it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def load_router(spec: str) -> JobRouter:
    """``package.module:attr`` → the ``JobRouter`` it names (the current directory is on the
    import path)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--app must look like module:attribute, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"cannot import {module_name!r}: {exc}") from None
    router = getattr(module, attr, None)
    if not isinstance(router, JobRouter):
        raise SystemExit(f"{spec} is not a conveyor.JobRouter")
    return router


def run(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop)`` on uvloop; SIGTERM/SIGINT set ``stop`` (a second one ends the process
    at once: ``lifecycle.install_signals``). Exit code 0 on a clean drain."""
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run

    async def wrapper() -> None:
        stop = asyncio.Event()
        install_signals(stop)
        await main(stop)

    runner(wrapper())


def api_server(
    settings: Settings,
    host: str,
    port: int,
    *,
    metrics: Metrics | None = None,
    background: Background | None = None,
) -> _Server:
    from ..api.app import create_app

    app = create_app(settings, metrics=metrics, background=background)
    return _Server(uvicorn.Config(app, host=host, port=port, loop="none", **_UVICORN))


def api_with_duties(settings: Settings, host: str, port: int) -> _Server:
    """``conveyor api``'s server: the API with the duties beside it (``cli/duties.py``), on one
    metrics registry."""
    from .duties import Duties

    metrics = Metrics()
    return api_server(settings, host, port, metrics=metrics, background=Duties(settings, metrics))


def api_app() -> Any:
    """The app of one ``conveyor api --workers N`` process. uvicorn imports this by name in each
    worker (a fresh interpreter, started by spawn): settings come from the environment the
    parent passed on, and logging is configured again, as ``cli.main`` did in the parent. Each
    process runs the duties beside its API, as one ``conveyor api`` does (any number of
    processes may run them)."""
    from ..api.app import create_app
    from .duties import Duties

    if not isinstance(sys.stderr, MaskedStream):  # as cli.main: no credential in any message
        sys.stderr = MaskedStream(sys.stderr)
    settings = Settings()
    configure(settings.log_level, settings.log_format, quiet=(*LIBRARY_LOGGERS, "alembic"))
    tracing.configure("conveyor-api")  # only OTEL_* variables turn it on
    metrics = Metrics()
    return create_app(settings, metrics=metrics, background=Duties(settings, metrics))


def serve_api_workers(sock: socket.socket, workers: int) -> None:
    """``workers`` API processes accepting on one listening socket, under uvicorn's supervisor:
    a worker that dies or stops answering its health ping is replaced; SIGTERM or SIGINT stops
    every worker (each drains its requests and closes its pool) and then the parent."""
    from uvicorn.supervisors.multiprocess import Multiprocess

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        "conveyor.cli.processes:api_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        **_UVICORN,
    )
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()


async def serve_api(
    server: _Server, stop: asyncio.Event, sockets: list[socket.socket] | None = None
) -> None:
    """Serve until ``stop`` (on ``sockets`` when given: the port was claimed up front). An API
    that could not start (its lifespan failed) is a ``CliError``, never a silent return."""
    task = asyncio.create_task(server.serve(sockets=sockets))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    stopper.cancel()
    with contextlib.suppress(SystemExit):  # uvicorn's sys.exit when its startup fails
        await task
    if not server.started and not stop.is_set():
        raise CliError("the API did not start (the lines above say why)")


async def run_publisher(
    settings: Settings,
    stop: asyncio.Event,
    *,
    maintenance: bool = True,
    health_port: int | None = None,
    metrics: Metrics | None = None,
) -> None:
    from ..maintenance.sweeper import Sweeper
    from ..publisher.relay import Relay, probes

    relay = Relay(settings, metrics)
    await start_with_retry(relay.start, stop, "publisher", settings)
    sweeper = Sweeper(settings, relay.metrics) if maintenance else None
    if sweeper is not None:
        await start_with_retry(sweeper.start, stop, "sweeper", settings)
    event(log, "publisher_started", maintenance=maintenance)
    server = None
    try:
        loops = [asyncio.create_task(relay.run(stop), name="relay")]
        if sweeper is not None:  # its duties and the gauges
            loops.append(asyncio.create_task(sweeper.run(stop), name="sweeper"))
        if health_port is not None:
            relay_live, ready = probes(relay, loops[0])
            live = relay_live if sweeper is None else _both(relay_live, sweeper.live)
            server = await serve_probes(
                "0.0.0.0", health_port, live=live, ready=ready, registry=relay.metrics.registry
            )
        await asyncio.gather(*loops)
    finally:
        if server is not None:
            server.close()
        await relay.close()
        if sweeper is not None:
            await sweeper.close()
        event(log, "publisher_stopped")


async def run_sweeper(
    settings: Settings, stop: asyncio.Event, *, health_port: int | None = None
) -> None:
    from ..maintenance.sweeper import Sweeper

    sweeper = Sweeper(settings)
    await start_with_retry(sweeper.start, stop, "sweeper", settings)
    server = None
    try:
        if health_port is not None:
            server = await serve_probes(
                "0.0.0.0",
                health_port,
                live=sweeper.live,
                ready=lambda: True,
                registry=sweeper.metrics.registry,
            )
        event(log, "sweeper_started")
        await sweeper.run(stop)
    finally:
        if server is not None:
            server.close()
        await sweeper.close()


def _both(
    a: Callable[[], tuple[bool, dict[str, Any]]], b: Callable[[], tuple[bool, dict[str, Any]]]
) -> Callable[[], tuple[bool, dict[str, Any]]]:
    """One liveness from two: live when both are; both details."""

    def live() -> tuple[bool, dict[str, Any]]:
        (ok_a, da), (ok_b, db) = a(), b()
        return ok_a and ok_b, {**da, "maintenance": db}

    return live


async def preflight(settings: Settings) -> str | None:
    """One clear line when PostgreSQL or RabbitMQ cannot be reached, else None."""
    from ..broker.cluster import BrokerRefused, reachable  # aio-pika: not in `conveyor api`

    try:  # the server, not the database: `conveyor migrate` creates that
        await check_server(settings.database_url, timeout=3)
    except Exception as exc:
        return (
            f"Cannot reach PostgreSQL at {mask_url(settings.database_url)} ({type(exc).__name__}). "
            "Start it: `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` "
            "or `docker compose up -d postgres rabbitmq` (URLs in .env.example)."
        )
    try:
        await reachable(settings.amqp_url, timeout=3)
    except Exception as exc:
        if isinstance(exc, BrokerRefused) and exc.authentication:  # starting it would not help
            return f"{exc}. Check the user and password in CONVEYOR_AMQP_URL."
        cause = exc.__cause__ if isinstance(exc, BrokerRefused) else exc
        return (
            f"Cannot reach RabbitMQ at {mask_url(settings.amqp_url)} ({type(cause).__name__}). "
            "Start it: `rabbitmq-server -detached` or `docker compose up -d postgres rabbitmq` "
            "(URLs in .env.example)."
        )
    return None


def loopback(host: str) -> bool:
    """Is ``host`` a loopback address (or ``localhost``)?"""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
