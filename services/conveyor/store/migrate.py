"""``conveyor migrate``: create the database when missing, then ``alembic upgrade head`` into
the schema ``CONVEYOR_DB_SCHEMA`` (Alembic's version table lives there too, so an application's
own Alembic history in ``public`` is never read or written)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from .connect import ensure_database
from .registry import check_schema
from .schema import DEFAULT_SCHEMA

SCHEMA_OPTION = "conveyor_schema"


class MigrationError(Exception):
    """A migration cannot proceed; the message is one line an operator can act on."""


def prepare(conn: Any, schema: str) -> None:
    """Run by ``migrations/env.py`` inside the migration's transaction, before the revisions:
    create the schema, refuse one that already holds a ``jobs`` table Conveyor did not create
    (no version table of Conveyor's beside it), and point ``search_path`` at the schema for this
    transaction, since revisions name their objects without one."""
    check_schema(schema)
    conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
    if _regclass(conn, f"{schema}.alembic_version") is None and (
        _regclass(conn, f"{schema}.jobs") is not None
    ):
        raise MigrationError(
            f"schema {schema!r} already has a table 'jobs' that Conveyor did not create; "
            "set CONVEYOR_DB_SCHEMA to a schema of Conveyor's own"
        )
    conn.execute(sa.text(f"SET LOCAL search_path TO {schema}"))


def _regclass(conn: Any, name: str) -> str | None:
    value = conn.execute(sa.text("SELECT to_regclass(:n)::text"), {"n": name}).scalar()
    return None if value is None else str(value)


def migrations_dir() -> Path:
    """Installed wheels carry the migrations inside the package; a source checkout has them at
    the repository root."""
    here = Path(__file__).resolve()
    packaged = here.parents[1] / "_migrations"
    if packaged.is_dir():
        return packaged
    return here.parents[3] / "migrations"


def alembic_config(url: str, schema: str = DEFAULT_SCHEMA) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.set_main_option(SCHEMA_OPTION, schema)
    return cfg


def upgrade(url: str, revision: str = "head", *, schema: str = DEFAULT_SCHEMA) -> None:
    """Blocking: runs alembic (which runs its own event loop). Call from a thread in async code."""
    command.upgrade(alembic_config(url, schema), revision)


# A migration's ALTER waits for its table's ACCESS EXCLUSIVE lock, and every later statement on
# the table queues behind it: behind one long transaction, an unbounded wait stopped every
# component's use of the table. So each try waits at most CONVEYOR_MIGRATE_LOCK_TIMEOUT seconds
# (migrations/env.py), letting the queue through between tries; CONVEYOR_MIGRATE_TRIES tries.
LOCK_TIMEOUT_ENV = "CONVEYOR_MIGRATE_LOCK_TIMEOUT"
TRIES_ENV = "CONVEYOR_MIGRATE_TRIES"
_LOCK_NOT_AVAILABLE = "55P03"


def migrate(url: str, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """Create the database if needed and upgrade it. Returns True when the database was created.
    Raises ``MigrationError`` with one line an operator can act on."""
    created = asyncio.run(ensure_database(url))
    tries = max(1, int(os.environ.get(TRIES_ENV, "12")))
    for attempt in range(1, tries + 1):
        try:
            upgrade(url, schema=schema)
        except MigrationError:
            raise
        except Exception as exc:
            if not _lock_wait(exc):
                raise MigrationError(_one_line(exc)) from exc
            if attempt == tries:
                raise MigrationError(
                    f"another transaction held a table this migration alters through {tries} "
                    f"tries of {os.environ.get(LOCK_TIMEOUT_ENV, '5')} s (lock_timeout); find "
                    "it in pg_stat_activity and run conveyor migrate again once it ends"
                ) from exc
            time.sleep(0.5)
    return created


def _lock_wait(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False


def _one_line(exc: BaseException) -> str:
    seen: BaseException | None = exc
    while seen is not None:  # the database's own words, when there are any
        if isinstance(seen, MigrationError):
            return str(seen)
        orig = getattr(seen, "orig", None)
        if orig is not None:
            seen = orig
            continue
        if seen.__cause__ is None:
            break
        seen = seen.__cause__
    text = str(seen or exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(seen or exc).__name__}: {first}"[:300]
