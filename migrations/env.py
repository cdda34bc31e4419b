"""Alembic environment: async engine on asyncpg; the URL comes from the config attribute
``sqlalchemy.url`` (set by ``conveyor migrate``) or ``CONVEYOR_DATABASE_URL``; the schema from
the option ``conveyor_schema`` or ``CONVEYOR_DB_SCHEMA`` (default ``conveyor``). Alembic's version
table lives in that schema, beside Conveyor's tables, so an application's own Alembic history in
``public`` stays out of Conveyor's way (and Conveyor out of its)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine

from conveyor.store.migrate import SCHEMA_OPTION, prepare
from conveyor.store.schema import DEFAULT_SCHEMA, VERSION_TABLE

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(
        "CONVEYOR_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/conveyor"
    )
    return url.replace("postgresql://", "postgresql+asyncpg://", 1)


def _schema() -> str:
    return config.get_main_option(SCHEMA_OPTION) or os.environ.get(
        "CONVEYOR_DB_SCHEMA", DEFAULT_SCHEMA
    )


def _options(schema: str) -> dict[str, Any]:
    def include_name(name: str | None, type_: str, _parent: Any) -> bool:
        return type_ != "schema" or name == schema

    return {
        # the schema is written in SQL (conveyor/store/sql/schema/), not as SQLAlchemy tables:
        # nothing to autogenerate from
        "target_metadata": None,
        "version_table": VERSION_TABLE,
        "version_table_schema": schema,
        "include_schemas": True,
        "include_name": include_name,
    }


def _run(connection: Any) -> None:
    schema = _schema()
    context.configure(connection=connection, **_options(schema))
    with context.begin_transaction():
        prepare(connection, schema)
        context.run_migrations()


async def _online() -> None:
    # each lock wait bounded (``store/migrate.py``: conveyor migrate tries again)
    lock_timeout = float(os.environ.get("CONVEYOR_MIGRATE_LOCK_TIMEOUT", "5"))
    settings = {"lock_timeout": str(round(lock_timeout * 1000))}
    engine = create_async_engine(_url(), connect_args={"server_settings": settings})
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():  # SQL for a DBA: no checks that need the database
    _offline_schema = _schema()
    context.configure(url=_url(), literal_binds=True, **_options(_offline_schema))
    with context.begin_transaction():
        context.execute(f"CREATE SCHEMA IF NOT EXISTS {_offline_schema}")
        context.execute(f"SET LOCAL search_path TO {_offline_schema}")
        context.run_migrations()
else:
    asyncio.run(_online())
