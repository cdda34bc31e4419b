"""Connections to one RabbitMQ node or to any node of a cluster.

``CONVEYOR_AMQP_URL`` may list several nodes, comma-separated: whole URLs
(``amqp://u:p@rmq-0:5672/,amqp://u:p@rmq-1:5672/``) or hosts after the first URL's credentials
(``amqp://u:p@rmq-0:5672,rmq-1:5672,rmq-2/vhost``). A connection goes to the first node that
answers; when it is lost, or an attempt fails, the next attempt goes to the next node in turn,
so a dead node is skipped instead of retried for ever (aio-pika's robust connection alone
retries the one URL it was given). Channels, queues and consumers are restored on the new node
by the robust connection as usual; quorum queues live on every node.

``heartbeat`` (seconds) is the AMQP heartbeat the connection asks for, unless the URL names
one (``?heartbeat=``); None leaves aiormq's own default (60 s). RabbitMQ closes a connection
from which it heard nothing (not even a heartbeat) for two to three heartbeats, and requeues
its unacknowledged deliveries for the other consumers: that is what takes a frozen worker's
deliveries from it (``CONVEYOR_WORKER_AMQP_HEARTBEAT``, 4 s). 0 asks for no heartbeat.

A connection whose first connect fails, times out or is cancelled is closed before the error
reaches the caller, so nothing it opened is left for the garbage collector. ``timeout`` bounds
one handshake; a component's start passes ``attempts=START_ATTEMPTS``, so a broker too loaded to
answer one handshake in time gets a few, each logged (``broker_connect_timed_out``), before the
start fails (a process's start then retries with backoff: ``cli/lifecycle.py``). A failure says
which node and which user (``BrokerRefused``; a handshake that never came, a ``TimeoutError``
naming the nodes), never the password.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractRobustConnection
from aio_pika.robust_connection import RobustConnection
from pamqp.common import FieldTable
from yarl import URL

from ..core.logging import event

log = logging.getLogger("conveyor.broker")

RECONNECT_INTERVAL = 2.0
# handshakes a component's start tries, each within the connect timeout, before it fails
START_ATTEMPTS = 3


class BrokerRefused(ConnectionError):
    """A node of ``CONVEYOR_AMQP_URL`` refused the connection or the login, or did not answer:
    the message names the node's host and port and the user (never the password), so a process
    retrying its start says what it tries. ``authentication``: the login was refused."""

    def __init__(self, message: str, *, authentication: bool = False) -> None:
        super().__init__(message)
        self.authentication = authentication


def _where(node: URL) -> str:
    return f"{node.host}:{node.explicit_port or (5671 if node.scheme == 'amqps' else 5672)}"


def refused(node: URL, exc: BaseException) -> BrokerRefused:
    """``exc``, raised connecting to ``node``, as a ``BrokerRefused`` naming where and who."""
    user = node.user or "guest"
    if isinstance(
        exc, aiormq.exceptions.AuthenticationError | aiormq.exceptions.ProbableAuthenticationError
    ):
        return BrokerRefused(
            f"RabbitMQ at {_where(node)} refused user {user!r}: authentication failed (a wrong "
            "password, or no such user)",
            authentication=True,
        )
    return BrokerRefused(f"RabbitMQ at {_where(node)} (user {user!r}): {type(exc).__name__}: {exc}")


def split_urls(url: str) -> list[str]:
    """Every node's URL in ``url`` (one or several, see the module's docstring)."""
    parts = [p.strip() for p in url.split(",") if p.strip()]
    if len(parts) <= 1 or all("://" in p for p in parts):
        return parts
    # "scheme://user:pass@host1:port1,host2:port2,host3/vhost?query": the hosts share the rest
    head, *rest = parts
    scheme, _, after = head.partition("://")
    userinfo, at, hostpart = after.rpartition("@")
    first_host, _, first_tail = hostpart.partition("/")
    _, last_slash, last_tail = rest[-1].partition("/")
    tail = last_tail if last_slash else first_tail
    hosts = [first_host] + [r.partition("/")[0] for r in rest]
    return [f"{scheme}://{userinfo}{at}{h}/{tail}" for h in hosts]


def heartbeat_url(url: URL, heartbeat: int | None) -> URL:
    """``url`` asking for ``heartbeat`` seconds, unless it names a heartbeat of its own."""
    if heartbeat is None or "heartbeat" in url.query:
        return url
    return url.update_query(heartbeat=str(heartbeat))


class ClusterConnection(RobustConnection):
    """A robust connection over several nodes: a failed attempt or a lost connection moves
    the next attempt to the next node."""

    def __init__(self, url: URL, *, nodes: list[URL], **kwargs: Any) -> None:
        self._nodes = nodes
        self._node = 0
        super().__init__(url, **kwargs)

    def next_node(self) -> None:
        self._node = (self._node + 1) % len(self._nodes)
        self.url = self._nodes[self._node]

    # RobustConnection's reconnect loop calls this (name-mangled) for every attempt.
    async def _RobustConnection__connect_transport(self) -> None:
        try:
            await _CONNECT_TRANSPORT(self)
        except BaseException:
            self.next_node()
            raise

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        if not self._close_called:
            self.next_node()
        await super()._on_connection_close(closing)


_CONNECT_TRANSPORT = RobustConnection._RobustConnection__connect_transport  # type: ignore[attr-defined]


async def connect(
    url: str,
    *,
    name: str,
    timeout: float = 5.0,
    attempts: int = 1,
    heartbeat: int | None = None,
) -> AbstractRobustConnection:
    """A robust connection named after the component, to the first node of ``url`` that
    answers (one node: aio-pika's own robust connection), asking for ``heartbeat`` (see the
    module's docstring). A handshake that outlasts ``timeout`` is tried again, up to
    ``attempts`` times in all (at most ``attempts * timeout`` seconds); a refused or rejected
    connection is not: it raises at once."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return await _connect_once(url, name=name, timeout=timeout, heartbeat=heartbeat)
        except TimeoutError as exc:
            hosts = ", ".join(_where(URL(n)) for n in split_urls(url))
            event(
                log,
                "broker_connect_timed_out",
                logging.WARNING,
                connection=name,
                broker=hosts,
                attempt=attempt,
                attempts=attempts,
                timeout=timeout,
            )
            if attempt == attempts:
                raise TimeoutError(
                    f"RabbitMQ at {hosts} did not complete a handshake within {timeout:g} s "
                    f"({attempts} tries)"
                ) from exc
    raise AssertionError("unreachable")


async def _connect_once(
    url: str, *, name: str, timeout: float, heartbeat: int | None
) -> AbstractRobustConnection:
    nodes = [heartbeat_url(URL(n), heartbeat) for n in split_urls(url)]
    properties: FieldTable = {"connection_name": name}
    if len(nodes) == 1:
        connection = RobustConnection(nodes[0], client_properties=properties)
        await _opened(connection, timeout)
        return connection
    last: BaseException | None = None
    for i in range(len(nodes)):
        order = nodes[i:] + nodes[:i]
        cluster = ClusterConnection(
            order[0],
            nodes=order,
            client_properties=properties,
            reconnect_interval=RECONNECT_INTERVAL,
        )
        try:
            await _opened(cluster, timeout)
            return cluster
        except Exception as exc:  # this node does not answer: the next one
            last = exc
    assert last is not None
    raise last


async def _opened(connection: aio_pika.Connection, timeout: float) -> None:
    """``connection`` connected within ``timeout``; closed when it is not (failed, timed out,
    cancelled): aio-pika leaves a connection whose connect failed open, for its finaliser to
    close on whatever event loop runs when it is collected."""
    try:
        await connection.connect(timeout=timeout)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await connection.close()
        if isinstance(exc, Exception) and not isinstance(exc, TimeoutError):
            raise refused(connection.url, exc) from exc
        raise


async def reachable(url: str, *, timeout: float = 3.0) -> None:
    """Raises unless some node of ``url`` accepts a connection."""
    last: BaseException | None = None
    for node in split_urls(url):
        connection = aio_pika.Connection(URL(node))
        try:
            await _opened(connection, timeout)
        except Exception as exc:
            last = exc
            continue
        await connection.close()
        return
    assert last is not None
    raise last
