"""Alembic environment: async engine on asyncpg; the URL comes from the config attribute
``sqlalchemy.url`` (set by ``conveyor migrate``) or ``CONVEYOR_DATABASE_URL``."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine

from conveyor.core.db.schema import metadata

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(
        "CONVEYOR_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/conveyor"
    )
    return url.replace("postgresql://", "postgresql+asyncpg://", 1)


def _run(connection: object) -> None:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _online() -> None:
    engine = create_async_engine(_url())
    async with engine.connect() as conn:
        await conn.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_online())
