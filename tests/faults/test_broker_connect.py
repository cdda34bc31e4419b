"""A broker too slow to answer its handshake, against ``broker.cluster.connect`` and the starts
that open a connection (the publisher's, the worker's). A connection whose connect fails or
times out is closed by ``connect`` itself, so no socket or unclosed connection is left for the
garbage collector to find later, in whatever test or request is running then; and a start
tries the handshake again a few times within a bound before it gives up.

The broker is a proxy in front of the shared RabbitMQ that accepts its first ``hold``
connections and never answers them (a node too loaded to speak), and forwards the later ones."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import sys
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

from conveyor.broker.cluster import connect, reachable
from conveyor.broker.consume import Subscription
from conveyor.core.config import Settings
from conveyor.publisher.relay import Relay

from .proxy import Proxy


class HeldProxy(Proxy):
    """Accepts its first ``hold`` connections and never answers them; forwards the others.
    ``held`` keeps the broker's end of each held connection, so a test can read what the client
    did with its end (EOF: it closed it)."""

    def __init__(self, host: str, port: int, *, hold: float) -> None:
        super().__init__(host, port)
        self.hold = hold
        self.accepted = 0
        self.held: list[asyncio.StreamReader] = []

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.accepted <= self.hold:
            self._writers.add(writer)
            self.held.append(reader)
            return
        await super()._accept(reader, writer)


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=(auth + "@" if auth else "") + f"127.0.0.1:{port}"))


@pytest.fixture
async def proxy(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[HeldProxy]:
    amqp = urlsplit(settings.amqp_url)
    hold = getattr(request, "param", math.inf)
    p = HeldProxy(amqp.hostname or "127.0.0.1", amqp.port or 5672, hold=hold)
    await p.start()
    yield p
    await p.close()


@pytest.fixture
def unraisable() -> Iterator[list[str]]:
    """What the interpreter could not raise (a finaliser's warning or error) while the test ran."""
    caught: list[str] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: caught.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        yield caught
    finally:
        sys.unraisablehook = previous


def _open_connections(port: int) -> list[Any]:
    """aio-pika connections to ``port`` still open (not yet collected: a cycle keeps them)."""
    return [
        o
        for o in gc.get_objects()
        if isinstance(o, aio_pika.abc.AbstractConnection)
        and getattr(o, "url", None) is not None
        and o.url.port == port
        and not o.is_closed
    ]


async def _client_closed(held: asyncio.StreamReader) -> bool:
    """The client closed its end of a held connection: the broker's end reads to EOF (its
    protocol header, then nothing) within 5 s."""
    try:
        await asyncio.wait_for(held.read(), 5)
    except TimeoutError:
        return False
    return held.at_eof()


async def _collected(unraisable: list[str]) -> list[str]:
    """Garbage-collect with every warning recorded; what the collection warned or could not
    raise (an unclosed socket or transport is a ResourceWarning)."""
    await asyncio.sleep(0.1)  # callbacks a close scheduled
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gc.collect()
        await asyncio.sleep(0.1)  # tasks a finaliser scheduled
        gc.collect()
    return [f"{w.category.__name__}: {w.message}" for w in seen] + unraisable


@pytest.mark.parametrize("how", ["connect", "reachable"])
async def test_a_silent_broker_leaves_no_connection_or_socket_behind(
    settings: Settings, proxy: HeldProxy, unraisable: list[str], how: str
) -> None:
    """One node that accepts and never answers: ``connect`` (and ``reachable``, the commands'
    check) raises TimeoutError after its bound, and what it opened is closed before it raises
    (the broker's end reads EOF, no aio-pika connection to the port is left open, collecting
    the garbage warns of nothing)."""
    url = _through(settings.amqp_url, proxy.port)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        if how == "connect":
            await connect(url, name="silent", timeout=0.5)
        else:
            await reachable(url, timeout=0.5)
    took = time.monotonic() - t0
    assert took < 5, took
    assert proxy.accepted == 1
    assert _open_connections(proxy.port) == []
    assert await _client_closed(proxy.held[0])
    assert await _collected(unraisable) == []


async def test_a_silent_broker_is_tried_start_attempts_times_then_the_start_fails(
    settings: Settings, proxy: HeldProxy, unraisable: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """With ``attempts`` the handshake is tried that many times, each within ``timeout`` (the
    configured bound of one handshake), each failed attempt closed and logged; then the last
    TimeoutError is raised: the bound of the whole is ``attempts * timeout``."""
    url = _through(settings.amqp_url, proxy.port)
    caplog.set_level(logging.WARNING, logger="conveyor")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await connect(url, name="silent", timeout=0.5, attempts=3)
    took = time.monotonic() - t0
    assert 1.5 <= took < 10, took
    assert proxy.accepted == 3
    assert [await _client_closed(h) for h in proxy.held] == [True] * 3
    retries = [r for r in caplog.records if r.getMessage() == "broker_connect_timed_out"]
    assert [r.fields["attempt"] for r in retries] == [1, 2, 3]  # type: ignore[attr-defined]
    assert _open_connections(proxy.port) == []
    assert await _collected(unraisable) == []


@pytest.mark.parametrize("proxy", [1], indirect=True)
async def test_a_relay_starts_when_its_first_handshake_outlasts_the_bound(
    settings: Settings, proxy: HeldProxy, unraisable: list[str]
) -> None:
    """The publisher's start: its first handshake is never answered (5 s, the connect bound),
    the second one is: ``Relay.start`` returns a started relay and the first try is closed."""
    relay = Relay(settings.model_copy(update={"amqp_url": _through(settings.amqp_url, proxy.port)}))
    try:
        await relay.start()
        assert relay.publisher.ready
        assert relay.publisher.connection is not None
        assert not relay.publisher.connection.is_closed
    finally:
        await relay.close()
    assert proxy.accepted == 2
    assert await _client_closed(proxy.held[0])
    assert _open_connections(proxy.port) == []
    assert await _collected(unraisable) == []


@pytest.mark.parametrize("proxy", [1], indirect=True)
async def test_a_worker_subscription_opens_when_its_first_handshake_outlasts_the_bound(
    settings: Settings, proxy: HeldProxy, unraisable: list[str]
) -> None:
    """The worker's start opens its subscription the same way."""
    sub = Subscription(
        _through(settings.amqp_url, proxy.port), settings.namespace, name="held", prefetch=4
    )
    try:
        await sub.open(["alpha"])
        assert sub.connected
    finally:
        await sub.close()
    assert proxy.accepted == 2
    assert await _client_closed(proxy.held[0])
    assert await _collected(unraisable) == []
