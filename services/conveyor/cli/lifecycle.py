"""Starting and stopping a process: its ports are claimed before any part starts (a port in use
is one line and a non-zero exit, never a process running without its API), and SIGTERM or SIGINT
stops it in every state: the first signal drains, a second one ends it at once."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import NoReturn

from ..core.backoff import Backoff
from ..core.config import Settings
from ..core.logging import event
from ..store.connect import check_database, is_misconfigured
from .support import CliError

log = logging.getLogger("conveyor")


def listen_socket(
    host: str, port: int, *, flag: str = "--port", make: bool = False
) -> socket.socket:
    """A socket bound to ``host:port`` and listening, or a ``CliError`` naming the cause and the
    fix (``flag`` with a free port; ``make dev PORT=…`` when ``make``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn binds
    try:
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
    except socket.gaierror as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        free = _free_port(family, host, port)
        fix = f"{flag} {free}" + (f" (make dev PORT={free})" if make else "")
        raise CliError(
            f"port {port} on {host} is in use by another process: stop it or start with {fix}"
        ) from None
    sock.set_inheritable(True)  # uvicorn's worker processes accept on it
    return sock


def check_health_port(port: int | None) -> None:
    """``listen_socket``'s check for ``--health-port`` (None: none), which the probes bind
    later themselves."""
    if port is not None:
        listen_socket("0.0.0.0", port, flag="--health-port").close()


def _free_port(family: socket.AddressFamily, host: str, port: int) -> int:
    """The first free port after ``port`` on ``host``, to suggest (else ``port + 1``)."""
    for candidate in range(port + 1, min(port + 50, 65536)):
        with contextlib.suppress(OSError), socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(socket.getaddrinfo(host, candidate, family, socket.SOCK_STREAM)[0][4])
            return candidate
    return port + 1


def _exit_now(code: int, action: str, **fields: str) -> NoReturn:
    """Log ``action``, flush the logs, end the process with ``code`` (no cleanup)."""
    event(log, action, logging.WARNING, **fields)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(code)


def install_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (the process drains and exits 0); a second one while it
    drains ends the process at once with 128 + the signal's number, as if the signal had killed
    it (jobs still running are not handed back: their leases expire and the sweeper requeues
    them)."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            stop.set()
            return
        _exit_now(128 + sig, "stopped_without_draining", signal=sig.name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


async def start_with_retry(
    start: Callable[[], Awaitable[None]], stop: asyncio.Event, name: str, settings: Settings
) -> None:
    """Start a part, waiting out what can heal (a refused connection, DNS, a database starting
    up, a role or database not created yet) with backoff. Each attempt first opens one connection
    to the database: a setting no server can accept (an unknown TLS version) is a ``CliError``
    (one line, exit 2) rather than a retry loop that never ends. ``stop`` (a signal) ends the
    wait at once, even during an attempt that hangs (a broker that accepts and never answers):
    the process exits 0, without a traceback."""

    async def attempt() -> None:
        await check_database(settings.database_url)
        await start()

    backoff = Backoff(base=0.5, cap=10)
    while True:
        trying = asyncio.ensure_future(attempt())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({trying, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if stop.is_set():
            if not trying.done():
                # an attempt still in a client's connect: cancelled, some clients (aio-pika's
                # robust connection) leave tasks that keep the loop from ever closing, and
                # nothing has started yet that would need a drain
                _exit_now(0, f"{name}_stopped_while_starting")
            if not trying.cancelled():
                trying.exception()  # retrieved: an attempt that failed as the signal came
            raise SystemExit(0)
        exc = trying.exception()
        if exc is None:
            return
        if is_misconfigured(exc):
            raise CliError(f"{name} cannot start: {type(exc).__name__}: {exc}") from exc
        if not isinstance(exc, Exception):
            raise exc
        delay = backoff.next()
        event(
            log, f"{name}_start_failed", logging.WARNING, error=repr(exc), retry_in=round(delay, 1)
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            raise SystemExit(0)
