"""Server-enforced bounds on Conveyor's own PostgreSQL sessions (docs/configuration.md).

A crashed process closes its connections and PostgreSQL rolls its transaction back; a *paused*
one (a frozen VM, a long GC pause, a partition, a lost host) leaves the connection open and its
locks held, and the server cannot tell it from a slow client (its TCP keepalive defaults to two
hours). So every component's session carries bounds PostgreSQL enforces itself:

- ``idle_in_transaction_session_timeout``: a session idle inside a transaction (the relay's
  while it waits for publish confirms, any component's while its process is frozen) is
  terminated after this long, which rolls the transaction back and releases its locks (the
  relay's outbox rows go back to the outbox, where another relay takes them);
- ``lock_timeout``: a statement waiting for a lock longer fails (55P03, an outage the caller
  retries); longer than the idle bound, so a waiter outlasts a frozen peer's bound;
- ``statement_timeout``: the server's own end of a statement whose client is gone;
- ``tcp_keepalives_*`` and ``tcp_user_timeout``: a peer that vanished (partition, lost host)
  is detected in seconds instead of hours, also while the session is not in a transaction.

They are startup parameters of each pooled connection (``connect.create_pool``); the
application's own connection (``enqueue()``) never gets them. PgBouncer refuses unknown startup
parameters: behind it (``CONVEYOR_DB_POOLER=transaction``) the same values are role settings
(``conveyor migrate --create-roles`` sets them, ``role_settings``) plus PgBouncer's own
``idle_transaction_timeout`` and keepalives (docs/scaling.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import LONG_STATEMENT_TIMEOUT


@dataclass(frozen=True)
class SessionBounds:
    """Seconds (``Settings.db_*``; defaults there); 0 turns a bound off."""

    idle_in_transaction: float
    lock: float
    statement: float
    keepalives_idle: int
    keepalives_interval: int
    keepalives_count: int
    tcp_user_timeout: float

    @classmethod
    def of(
        cls, settings: Any, *, statement_floor: float = 0.0, idle_floor: float = 0.0
    ) -> SessionBounds:
        """The bounds ``settings`` ask for; ``statement_floor``: a component whose own limit
        for some statements is longer (the API's batch insert) keeps at least that;
        ``idle_floor``: one that legitimately waits inside a transaction (the relay, for its
        broker's confirms) keeps at least that."""
        statement = settings.db_statement_timeout
        if statement:
            statement = max(statement, statement_floor)
        idle = settings.db_idle_in_transaction_timeout
        if idle:
            idle = max(idle, idle_floor)
        return cls(
            idle_in_transaction=idle,
            lock=settings.db_lock_timeout,
            statement=statement,
            keepalives_idle=settings.db_keepalives_idle,
            keepalives_interval=settings.db_keepalives_interval,
            keepalives_count=settings.db_keepalives_count,
            tcp_user_timeout=settings.db_tcp_user_timeout,
        )

    def server_settings(self) -> dict[str, str]:
        """PostgreSQL settings (startup parameters or ``ALTER ROLE … SET``), in milliseconds
        or seconds as each one counts; a bound of 0 is left out (the server's default)."""
        out = {
            "idle_in_transaction_session_timeout": _ms(self.idle_in_transaction),
            "lock_timeout": _ms(self.lock),
            "statement_timeout": _ms(self.statement),
            "tcp_keepalives_idle": str(self.keepalives_idle),
            "tcp_keepalives_interval": str(self.keepalives_interval),
            "tcp_keepalives_count": str(self.keepalives_count),
            "tcp_user_timeout": _ms(self.tcp_user_timeout),
        }
        return {k: v for k, v in out.items() if v != "0"}


# A sweeper duty's locking transaction (the schedules pass, a type's reconcile) takes
# milliseconds: idle inside it this long, its sweeper is paused and PostgreSQL ends the session
# so its locks go; a lock wait inside it fails after as long (``Store.maintenance_bound``).
DUTY_BOUND_SECONDS = 5.0


# A transaction that settles one job or a batch of them (the API's cancel, the sweeper's lease
# recovery) bounds its statements on the server at this share of the caller's own time limit
# (``local_bounds``): the server ends a statement held by a lock or a slow trigger with an error
# that names the bound (55P03, 57014) while the caller still has time to answer, where the
# caller's own timeout says nothing of why and reads as an outage.
LOCAL_BOUND_SHARE = 0.5
# ... and its lock waits at this share of the statement bound, so that a statement that waited
# for a lock all along fails as a lock wait (55P03), not as a statement too long (57014)
LOCAL_LOCK_SHARE = 0.8


def local_bounds(limit: float, lock: float) -> tuple[float, float]:
    """(statement, lock) bounds in seconds for a transaction whose caller gives up after
    ``limit``: the statement bound is ``LOCAL_BOUND_SHARE`` of it, the lock bound
    ``LOCAL_LOCK_SHARE`` of that, and no longer than the session's (``lock``; 0: none)."""
    statement = limit * LOCAL_BOUND_SHARE
    lock_wait = statement * LOCAL_LOCK_SHARE
    return statement, min(lock, lock_wait) if lock else lock_wait


# the API's statement bound stays above its batch insert's own limit (``Api.long``)
API_STATEMENT_FLOOR = LONG_STATEMENT_TIMEOUT + 30


# the relay waits for its batch's confirms inside its transaction, up to its publish timeout
RELAY_PUBLISH_TIMEOUT = 10.0


def relay_idle_floor(settings: Any, publish_timeout: float = RELAY_PUBLISH_TIMEOUT) -> float:
    """The relay's idle bound covers its whole confirm wait plus the bound itself: a session
    ended while it waits on a slow broker rolls the batch back after the broker took it, and the
    next batch publishes every message again (a broker confirming in 5-10 s would get each batch
    again and again). A frozen relay's rows come back this much later instead."""
    return publish_timeout + float(settings.db_idle_in_transaction_timeout)


def component_bounds(settings: Any) -> dict[str, SessionBounds]:
    """Each component's bounds (``roles.COMPONENTS``)."""
    plain = SessionBounds.of(settings)
    api = SessionBounds.of(settings, statement_floor=API_STATEMENT_FLOOR)
    publisher = SessionBounds.of(settings, idle_floor=relay_idle_floor(settings))
    return {"api": api, "publisher": publisher, "worker": plain, "sweeper": plain}


def _ms(seconds: float) -> str:
    return str(round(seconds * 1000))
