"""Transactional enqueue for applications that are not async: ``enqueue`` / ``enqueue_many``
on a psycopg (3) connection or a synchronous SQLAlchemy ``Session`` / ``Connection`` on the
psycopg driver (``postgresql+psycopg://``), inside the caller's transaction: the job exists
exactly when the caller commits. The same code as ``conveyor.enqueue`` runs underneath."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from .core.jobs import JobOptions
from .enqueue import enqueue_many as enqueue_many_async
from .jobs.spec import JobSpec
from .store.sync import SyncConnection, run_sync
from .workflows import Workflow
from .workflows import cancel_workflow as cancel_workflow_async
from .workflows import enqueue_workflow as enqueue_workflow_async


def _psycopg_connection(conn: Any) -> Any:
    """The psycopg connection behind ``conn`` (psycopg, SQLAlchemy Session or Connection),
    with a SQLAlchemy transaction begun: statements on the driver's connection bypass
    SQLAlchemy's autobegin, and a ``Connection.commit()`` with none begun commits nothing (the
    pool's reset on return then rolled the job back)."""
    import psycopg
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(conn, psycopg.Connection):
        return conn
    sa_conn = conn.connection() if isinstance(conn, Session) else conn  # begins the session's
    if isinstance(sa_conn, Connection) and not sa_conn.in_transaction():
        sa_conn.begin()  # what autobegin would do at the caller's next statement
    fairy = getattr(sa_conn, "connection", None)  # the pooled DBAPI connection
    driver = getattr(fairy, "driver_connection", None)
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(
            "enqueue_sync needs a psycopg connection, or a SQLAlchemy Session/Connection on "
            "the psycopg driver (postgresql+psycopg://)"
        )
    return driver


def enqueue(
    conn: Any,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    schema: str | None = None,
    **options: Unpack[JobOptions],
) -> uuid.UUID:
    """``conveyor.enqueue`` for a synchronous connection (same options, same errors)."""
    spec = JobSpec(job_type, payload, **options)
    return enqueue_many(conn, [spec], schema=schema)[0]


def enqueue_many(
    conn: Any, specs: Sequence[JobSpec], *, notify: bool = True, schema: str | None = None
) -> list[uuid.UUID]:
    """Several jobs in one statement on ``conn`` (the caller's transaction)."""
    sync = SyncConnection(_psycopg_connection(conn))
    return run_sync(enqueue_many_async(sync, specs, notify=notify, schema=schema))


def enqueue_workflow(
    conn: Any, workflow: Workflow, *, notify: bool = True, schema: str | None = None
) -> uuid.UUID:
    """``conveyor.enqueue_workflow`` on a synchronous connection (the caller's transaction)."""
    sync = SyncConnection(_psycopg_connection(conn))
    return run_sync(enqueue_workflow_async(sync, workflow, notify=notify, schema=schema))


def cancel_workflow(conn: Any, workflow_id: uuid.UUID, *, schema: str | None = None) -> int:
    """``conveyor.cancel_workflow`` on a synchronous connection."""
    sync = SyncConnection(_psycopg_connection(conn))
    return run_sync(cancel_workflow_async(sync, workflow_id, schema=schema))
