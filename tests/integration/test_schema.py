"""The migrations build what the schema files describe, every named statement prepares against
a migrated database, and `conveyor migrate` creates a missing database."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import asyncpg
from alembic import command
from alembic.script import ScriptDirectory

from conveyor.core.jobs import Status
from conveyor.store import HEAD, for_schema
from conveyor.store.connect import with_database
from conveyor.store.migrate import alembic_config
from conveyor.store.schema import DEFAULT_SCHEMA, schema_statements

from ..services import Endpoints
from .catalog import describe


async def test_the_schema_files_are_what_the_migrations_build(db: asyncpg.Connection) -> None:
    """The database the migrations built (``conveyor``) and one built from the schema files
    alone (in a schema of its own): the same relations, columns, constraints, indexes,
    functions, triggers, views, types and statistics, each by its catalog definition."""
    await db.execute("CREATE SCHEMA files")
    for statement in schema_statements("files"):
        await db.execute(statement)
    migrated = await describe(db, DEFAULT_SCHEMA)
    files = {
        name.replace("files.", f"{DEFAULT_SCHEMA}."): text.replace("files", DEFAULT_SCHEMA)
        for name, text in (await describe(db, "files")).items()
    }
    assert len(migrated) > 200
    assert {k for k in migrated if k.startswith("function ")} == {
        k for k in files if k.startswith("function ")
    }
    drift = {k: (migrated.get(k), files.get(k)) for k in migrated.keys() | files.keys()
             if migrated.get(k) != files.get(k)}  # fmt: skip
    assert drift == {}


async def test_a_planted_drift_is_found(db: asyncpg.Connection) -> None:
    """The comparison sees a function body, a default and an index changed by hand."""
    before = await describe(db, DEFAULT_SCHEMA)
    await db.execute(
        "CREATE OR REPLACE FUNCTION workflow_outcome(wf uuid, cancelled boolean) RETURNS text"
        " LANGUAGE sql STABLE AS $$ SELECT 'COMPLETED' $$;"
        " ALTER TABLE schedules ALTER COLUMN priority SET DEFAULT 4;"
        " DROP INDEX jobs_due_idx; CREATE INDEX jobs_due_idx ON jobs (run_at)"
    )
    after = await describe(db, DEFAULT_SCHEMA)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed == {
        "function workflow_outcome(wf uuid, cancelled boolean)",
        "column schedules.priority",
        "index jobs_due_idx",
    }


def test_the_baseline_goes_down_and_up_again(db_url: str) -> None:
    config = alembic_config(db_url)
    command.downgrade(config, "base")
    command.upgrade(config, "head")


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
