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
from sqlalchemy.ext.asyncio import create_async_engine

from conveyor.core.db import store
from conveyor.core.db.connect import with_database
from conveyor.core.db.schema import metadata
from conveyor.core.jobs import Status

from ..services import Endpoints


async def test_migrations_match_the_metadata(db_url: str) -> None:
    engine = create_async_engine(db_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_type": True}), metadata
                )
            )
    finally:
        await engine.dispose()
    assert diff == []


async def test_status_enum_has_the_seven_statuses(db: asyncpg.Connection) -> None:
    labels = await db.fetchval("SELECT enum_range(NULL::job_status)::text[]")
    assert labels == [s.value for s in Status]


async def test_every_named_statement_prepares(db: asyncpg.Connection) -> None:
    assert len(store.STATEMENTS) >= 20
    for name, sql in store.STATEMENTS.items():
        try:
            await db.prepare(sql)
        except asyncpg.PostgresError as exc:  # pragma: no cover - the failure message is the point
            raise AssertionError(f"statement {name} does not prepare: {exc}") from exc


async def test_hot_indexes_exist(db: asyncpg.Connection) -> None:
    names = {
        r["indexname"]
        for r in await db.fetch("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")
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
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == "0002"
        finally:
            await conn.close()
    finally:
        admin = await asyncpg.connect(endpoints.database_url)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
