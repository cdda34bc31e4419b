"""The migrations are the schema: no drift from the SQLAlchemy metadata, every named statement
prepares against a migrated database, and `conveyor migrate` creates a missing database."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

from conveyor.core.jobs import Status
from conveyor.store import HEAD, for_schema
from conveyor.store.connect import with_database
from conveyor.store.migrate import alembic_config
from conveyor.store.schema import DEFAULT_SCHEMA, metadata_for

from ..services import Endpoints


async def test_migrations_match_the_metadata(db_url: str) -> None:
    engine = create_async_engine(db_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(
                        sync,
                        opts={
                            "compare_type": True,
                            "include_schemas": True,
                            "include_name": lambda name, type_, _: (
                                type_ != "schema" or name == DEFAULT_SCHEMA
                            ),
                            "version_table_schema": DEFAULT_SCHEMA,
                        },
                    ),
                    metadata_for(DEFAULT_SCHEMA),
                )
            )
    finally:
        await engine.dispose()
    assert diff == []


async def test_status_enum_has_the_seven_statuses(db: asyncpg.Connection) -> None:
    labels = await db.fetchval("SELECT enum_range(NULL::job_status)::text[]")
    assert labels == [s.value for s in Status]


def test_head_is_the_newest_migration() -> None:
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused/x"))
    assert script.get_current_head() == HEAD


async def test_every_named_statement_prepares(db_url: str) -> None:
    """On a connection whose search_path does not include Conveyor's schema, as an
    application's connection or a PgBouncer-pooled one: every statement names the schema."""
    statements = for_schema(DEFAULT_SCHEMA).sql
    assert len(statements) >= 24
    conn = await asyncpg.connect(db_url, server_settings={"search_path": "public"})
    try:
        for name, sql in statements.items():
            try:
                await conn.prepare(sql)
            except asyncpg.PostgresError as exc:  # pragma: no cover - the message is the point
                raise AssertionError(f"statement {name} does not prepare: {exc}") from exc
    finally:
        await conn.close()


async def test_hot_indexes_exist(db: asyncpg.Connection) -> None:
    names = {
        r["indexname"]
        for r in await db.fetch("SELECT indexname FROM pg_indexes WHERE schemaname = 'conveyor'")
    }
    assert {
        "jobs_pkey",
        "job_outbox_pkey",
        "jobs_type_status_id_idx",
        "jobs_idempotency_key_idx",
        "jobs_due_idx",
        "jobs_lease_idx",
    } <= names


async def test_conveyor_migrate_creates_the_database(endpoints: Endpoints) -> None:
    name = f"conveyor_mig_{uuid.uuid4().hex[:8]}"
    url = with_database(endpoints.database_url, name)
    env = {**os.environ, "CONVEYOR_DATABASE_URL": url}
    try:
        for expected in ("created and migrated", "migrated to head"):
            out = subprocess.run(
                [sys.executable, "-m", "conveyor.cli", "migrate"],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            assert expected in out.stdout
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT version_num FROM conveyor.alembic_version") == HEAD
            assert await conn.fetchval("SELECT to_regclass('public.alembic_version')") is None
        finally:
            await conn.close()
    finally:
        admin = await asyncpg.connect(endpoints.database_url)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def test_offline_sql_for_a_dba_names_the_schema() -> None:
    """``alembic upgrade head --sql`` (offline): the schema is created, everything lands in it."""
    out = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head", "--sql"],
        env={**os.environ, "CONVEYOR_DB_SCHEMA": "conveyor"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CREATE SCHEMA IF NOT EXISTS conveyor;" in out.stdout
    assert "INSERT INTO conveyor.alembic_version" in out.stdout
