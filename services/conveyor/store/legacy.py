"""Run before Alembic's migrations on the migration's connection (``migrations/env.py``): create
the schema, recognise a round-one install (tables in ``public``, version row in
``public.alembic_version``) and hand its version row to the schema's own version table, so
revision 0003 moves its tables. An application's own ``public.alembic_version`` and
``public.jobs`` are never touched: a layout counts as Conveyor's only when the version row is one
of Conveyor's revisions *and* the tables carry Conveyor's columns."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from .registry import check_schema

LEGACY_REVISIONS = ("0001", "0002")
LEGACY_FLAG = "conveyor_legacy_move"

# Columns only Conveyor's tables have together.
_SIGNATURE = """
SELECT count(*) FROM information_schema.columns
WHERE table_schema = 'public'
  AND ((table_name = 'jobs' AND column_name IN
        ('job_type', 'cancel_requested', 'lease_expires_at', 'request_hash', 'attempts'))
       OR (table_name = 'job_outbox' AND column_name IN ('job_id', 'destination', 'delay_seconds')))
"""
_SIGNATURE_COLUMNS = 8


class MigrationError(Exception):
    """A migration cannot proceed; the message is one line an operator can act on."""


def prepare(conn: Any, schema: str) -> None:
    """Inside the migration's transaction, before ``run_migrations``."""
    check_schema(schema)
    conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
    path = schema
    if _regclass(conn, f"{schema}.alembic_version") is None:
        legacy = _legacy_revision(conn) if schema != "public" else None
        if legacy is not None:
            if _regclass(conn, f"{schema}.jobs") is not None:
                raise MigrationError(
                    f"both public.jobs (a Conveyor install at revision {legacy}) and "
                    f"{schema}.jobs exist; move or drop one of them, then migrate again"
                )
            _adopt_version(conn, schema, legacy)
            conn.info[LEGACY_FLAG] = True
            # revisions before 0003 then find the legacy tables in public; 0003 moves them
            path = f"{schema}, public"
        elif _regclass(conn, f"{schema}.jobs") is not None:
            raise MigrationError(
                f"schema {schema!r} already has a table 'jobs' that Conveyor did not create; "
                "set CONVEYOR_DB_SCHEMA to a schema of Conveyor's own"
            )
    # Earlier revisions name their objects without a schema: they land in ``schema``.
    conn.execute(sa.text(f"SET LOCAL search_path TO {path}"))


def _regclass(conn: Any, name: str) -> str | None:
    value = conn.execute(sa.text("SELECT to_regclass(:n)::text"), {"n": name}).scalar()
    return None if value is None else str(value)


def _legacy_revision(conn: Any) -> str | None:
    if _regclass(conn, "public.alembic_version") is None:
        return None
    if _regclass(conn, "public.jobs") is None or _regclass(conn, "public.job_outbox") is None:
        return None
    versions = [
        str(v)
        for v in conn.execute(sa.text("SELECT version_num FROM public.alembic_version"))
        .scalars()
        .all()
    ]
    ours = [v for v in versions if v in LEGACY_REVISIONS]
    if len(ours) != 1:
        return None
    if conn.execute(sa.text(_SIGNATURE)).scalar() != _SIGNATURE_COLUMNS:
        return None
    enum = conn.execute(sa.text("SELECT to_regtype('public.job_status')::text")).scalar()
    return ours[0] if enum is not None else None


def _adopt_version(conn: Any, schema: str, revision: str) -> None:
    conn.execute(
        sa.text(
            f"CREATE TABLE {schema}.alembic_version (version_num varchar(32) NOT NULL, "
            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
    )
    conn.execute(
        sa.text(f"INSERT INTO {schema}.alembic_version (version_num) VALUES (:v)"),
        {"v": revision},
    )
    conn.execute(
        sa.text("DELETE FROM public.alembic_version WHERE version_num = :v"), {"v": revision}
    )
    if not conn.execute(sa.text("SELECT EXISTS (SELECT 1 FROM public.alembic_version)")).scalar():
        conn.execute(sa.text("DROP TABLE public.alembic_version"))


def move_from_public(conn: Any, schema: str) -> None:
    """Revision 0003 on a legacy install: the tables (with their rows, indexes, constraints and
    identity sequence) and the status type move into ``schema``."""
    if not getattr(conn, "info", {}).get(LEGACY_FLAG):  # offline (--sql) mode: no move
        return
    check_schema(schema)
    conn.execute(sa.text(f"ALTER TYPE public.job_status SET SCHEMA {schema}"))
    conn.execute(sa.text(f"ALTER TABLE public.jobs SET SCHEMA {schema}"))
    conn.execute(sa.text(f"ALTER TABLE public.job_outbox SET SCHEMA {schema}"))
    conn.execute(sa.text("DROP FUNCTION IF EXISTS public.conveyor_outbox_notify()"))
    conn.execute(sa.text(f"SET LOCAL search_path TO {schema}"))
