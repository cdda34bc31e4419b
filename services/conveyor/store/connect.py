"""Connections to PostgreSQL: pools per component, database creation, outage classification."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from ..core.errors import MissingPartitionKey
from .bounds import SessionBounds
from .registry import TEMPLATES, named

DATABASE_EXISTS = named("database_exists")

# Exceptions that mean "PostgreSQL is not reachable / the connection broke", as opposed to a bug
# or a constraint violation. Callers map them to 503 or retry with backoff.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    socket.gaierror,
    asyncio.TimeoutError,
    TimeoutError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.QueryCanceledError,
    # the session bounds (``bounds.py``): a lock waited for past ``lock_timeout``, a session
    # ended by ``idle_in_transaction_session_timeout`` (its process was frozen or too slow)
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
    # a pooled connection whose backend was terminated while idle: the next statement fails with
    # "cannot switch to state N; another operation (2) is in progress"
    asyncpg.exceptions.InternalClientError,
)


def is_unavailable(exc: BaseException) -> bool:
    """An outage (retry with backoff), not a configuration error: asyncpg reports a bad
    connection option as an ``InterfaceError`` too, and retrying that would never end."""
    return isinstance(exc, UNAVAILABLE) and not is_misconfigured(exc)


def is_misconfigured(exc: BaseException) -> bool:
    """A connection option no server can accept (``?sslmode=bogus``, a non-numeric port)."""
    return isinstance(exc, asyncpg.exceptions.ClientConfigurationError | ValueError)


# The schema, a table or the status type is missing: the database was never migrated (or was
# migrated into another CONVEYOR_DB_SCHEMA).
UNMIGRATED: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.UndefinedTableError,
    asyncpg.exceptions.InvalidSchemaNameError,
    asyncpg.exceptions.UndefinedObjectError,
)


def is_unmigrated(exc: BaseException) -> bool:
    return isinstance(exc, UNMIGRATED)


def is_missing_database(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError)


def is_refused_login(exc: BaseException) -> bool:
    """The server refused the role: no such role, a wrong password, no pg_hba entry."""
    return isinstance(exc, asyncpg.exceptions.InvalidAuthorizationSpecificationError)


def is_unique_violation(exc: BaseException, constraint: str) -> bool:
    """A unique index or constraint named ``constraint`` refused a row."""
    return (
        isinstance(exc, asyncpg.UniqueViolationError)
        and getattr(exc, "constraint_name", None) == constraint
    )


def is_check_violation(exc: BaseException, constraint: str) -> bool:
    """A check named ``constraint`` (a constraint, or a function raising in its name) refused
    a row."""
    return (
        isinstance(exc, asyncpg.CheckViolationError)
        and getattr(exc, "constraint_name", None) == constraint
    )


@contextlib.contextmanager
def partition_key_checked() -> Iterator[None]:
    """A submit refused for a missing partition key (``admission.sql``'s
    ``partition_key_for``) raises ``MissingPartitionKey`` with the server's message."""
    try:
        yield
    except asyncpg.CheckViolationError as exc:
        if is_check_violation(exc, "missing_partition_key"):
            raise MissingPartitionKey(exc.args[0] if exc.args else str(exc)) from None
        raise


async def connect(url: str, **options: Any) -> Any:
    """One connection of its own (an asyncpg connection; ``options`` as ``asyncpg.connect``)."""
    return await asyncpg.connect(url, **options)


POOLERS = ("none", "transaction")


def connect_options(pooler: str = "none") -> dict[str, Any]:
    """asyncpg options for ``CONVEYOR_DB_POOLER``. Behind PgBouncer in transaction pooling two
    statements of one client may run on two server connections, so a named prepared statement
    (asyncpg's statement cache) may not exist where the next execution lands:
    ``statement_cache_size=0`` makes asyncpg prepare each statement unnamed, within the
    round trip that runs it. Nothing else of Conveyor's relies on session state: statements
    name their schema (no ``search_path``), the reconciler's lock is transaction-level
    (``pg_try_advisory_xact_lock``), LISTEN goes to ``listen_url`` or is replaced by polling."""
    if pooler not in POOLERS:
        raise ValueError(f"unknown pooler {pooler!r}: use one of {', '.join(POOLERS)}")
    return {"statement_cache_size": 0} if pooler == "transaction" else {}


def listen_url(database_url: str, pooler: str, listen_database_url: str | None) -> str | None:
    """Where the relay LISTENs: ``CONVEYOR_LISTEN_DATABASE_URL`` when set, else the database
    URL unless it goes through a transaction pooler (a LISTEN there is lost with the server
    connection it ran on); None: poll every ``relay_poll_interval``."""
    if listen_database_url:
        return listen_database_url
    return None if pooler == "transaction" else database_url


async def create_pool(
    url: str,
    *,
    application_name: str,
    min_size: int = 0,
    max_size: int = 10,
    timeout: float = 5.0,
    command_timeout: float | None = None,
    pooler: str = "none",
    bounds: SessionBounds | None = None,
) -> Any:
    """A pool that does not connect eagerly (``min_size=0``), so a process starts while the
    database is down and recovers by itself when it comes back. ``pooler``: see
    ``connect_options``. ``bounds``: the session bounds PostgreSQL enforces (``bounds.py``),
    passed as startup parameters; not through a transaction pooler, which refuses them (there
    they are role settings).

    JIT off: asyncpg reads each non-builtin type's definition once per connection with a
    catalog query whose estimated cost passes ``jit_above_cost``; JIT-compiling it took
    0.7-1 s of CPU a connection (the query itself: milliseconds), and Conveyor's statements are
    index lookups JIT never speeds up. A transaction pooler passes no session setting (PgBouncer
    refuses unknown startup parameters): there ``conveyor migrate --create-roles`` sets it on the
    component roles (``ALTER ROLE … SET jit = off``; docs/scaling.md)."""
    return await asyncpg.create_pool(
        url,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        command_timeout=command_timeout,
        max_inactive_connection_lifetime=60.0,
        server_settings=_server_settings(application_name, pooler, bounds),
        reset=_skip_session_reset,
        **connect_options(pooler),
    )


async def connect_one(
    url: str,
    *,
    application_name: str,
    pooler: str = "none",
    bounds: SessionBounds | None = None,
    timeout: float = 5.0,
    command_timeout: float | None = None,
) -> Any:
    """One connection of its own, not pooled, with a pool's settings (``create_pool``)."""
    return await asyncpg.connect(
        url,
        timeout=timeout,
        command_timeout=command_timeout,
        server_settings=_server_settings(application_name, pooler, bounds),
        **connect_options(pooler),
    )


def _server_settings(
    application_name: str, pooler: str, bounds: SessionBounds | None
) -> dict[str, str]:
    settings = {"application_name": application_name}
    if pooler == "none":
        settings["jit"] = "off"
        if bounds is not None:
            settings |= bounds.server_settings()
    return settings


async def _skip_session_reset(conn: Any) -> None:
    """Release without asyncpg's default reset query (``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL``), a round trip on every release. Conveyor's pooled connections take
    no advisory locks, cursors, LISTENs or SET commands (the relay LISTENs on a connection of its
    own); an open transaction is still rolled back by the pool itself."""


async def listen(url: str, channel: str, callback: Callable[[], None], *, name: str) -> Any:
    """A connection of its own that LISTENs on ``channel`` and calls ``callback`` for each
    notification (LISTEN needs a session: not through a transaction-pooling PgBouncer)."""
    conn = await asyncpg.connect(url, timeout=5, server_settings={"application_name": name})
    try:
        await conn.add_listener(channel, lambda *_: callback())
    except BaseException:
        await conn.close()
        raise
    return conn


def database_name(url: str) -> str:
    name = urlsplit(url).path.lstrip("/")
    return name or "postgres"


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


async def check_server(url: str, *, timeout: float = 3.0) -> None:
    """Connect to the server of ``url`` (its ``postgres`` database); raises when unreachable."""
    conn = await asyncpg.connect(with_database(url, "postgres"), timeout=timeout)
    await conn.close()


async def ensure_database(url: str, *, timeout: float = 5.0) -> bool:
    """Create the database of ``url`` when it does not exist. Returns True when created."""
    name = database_name(url)
    conn = await asyncpg.connect(with_database(url, "postgres"), timeout=timeout)
    try:
        exists = await conn.fetchval(TEMPLATES[DATABASE_EXISTS], name)
        if exists:
            return False
        quoted = '"' + name.replace('"', '""') + '"'
        try:
            await conn.execute(f"CREATE DATABASE {quoted}")
        except asyncpg.exceptions.DuplicateDatabaseError:
            return False
        return True
    finally:
        await conn.close()


async def check_database(url: str, *, timeout: float = 5.0) -> None:
    """Open and close one connection to ``url``'s database; raises what connecting raised."""
    conn = await asyncpg.connect(url, timeout=timeout)
    await conn.close()
