"""A tiny HTTP endpoint for the probes of processes without an API (worker, publisher). No
framework: it must answer while the process is busy, and must not answer when the event loop is
stuck — which is the point of a liveness probe.

``/healthz`` → ``live()`` (200 or 503 with details), ``/readyz`` → ``ready()``, ``/metrics`` →
Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Live = Callable[[], tuple[bool, dict[str, Any]]]


class Background(Protocol):
    """Work a process runs beside its own until ``stop`` (the duties, ``cli/duties.py``), with
    the details its health probe shows."""

    async def run(self, stop: asyncio.Event) -> None: ...

    def details(self) -> dict[str, Any]: ...


@contextlib.asynccontextmanager
async def beside(background: Background | None, *, wait: float = 20.0) -> AsyncIterator[None]:
    """Run ``background`` while the block runs; at its end, stop it and wait (at most ``wait``
    seconds) for it to close what it opened."""
    if background is None:
        yield
        return
    stop = asyncio.Event()
    task = asyncio.create_task(background.run(stop))
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, wait)


_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


class DownTimer:
    """How long a dependency has been down, for "down longer than a grace period" checks."""

    def __init__(self) -> None:
        self._since: float | None = None

    def update(self, up: bool) -> float:
        now = time.monotonic()
        if up:
            self._since = None
        elif self._since is None:
            self._since = now
        return 0.0 if self._since is None else now - self._since


async def serve_probes(
    host: str, port: int, *, live: Live, ready: Callable[[], bool], registry: CollectorRegistry
) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            path = line.split(b" ")[1].decode() if line.count(b" ") >= 2 else "/"
            ctype = "application/json"
            if path == "/healthz":
                ok, details = live()
                status, body = (200 if ok else 503), orjson.dumps(details)
            elif path == "/readyz":
                ok = ready()
                status, body = (200 if ok else 503), orjson.dumps({"ready": ok})
            elif path == "/metrics":
                status, body, ctype = 200, generate_latest(registry), CONTENT_TYPE_LATEST
            else:
                status, body = 404, b'{"error": "not found"}'
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
