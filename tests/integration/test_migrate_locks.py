"""``conveyor migrate`` beside a transaction that holds a table it alters. A migration's ALTER
waits for an ACCESS EXCLUSIVE lock, and every later statement on that table queues behind the
waiting ALTER: with no bound of its own, a migration behind one long (or forgotten, or frozen)
transaction stopped every component's use of the table for as long as that transaction lasted
(each component statement failing at its own ``lock_timeout``). The migration waits a few
seconds at a time instead, letting the queue through between tries, and says what blocked it."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from alembic import command

from conveyor.store.migrate import MigrationError, alembic_config, migrate
from conveyor.store.probes import HEAD

from .. import db as tdb


async def test_a_migration_behind_a_long_transaction_does_not_stall_the_components(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_MIGRATE_LOCK_TIMEOUT", "1")
    monkeypatch.setenv("CONVEYOR_MIGRATE_TRIES", "3")
    # back before the last revision that alters a table (0019 adds columns to jobs; 0020 and
    # 0021 replace a function, which waits for no table's lock)
    await asyncio.to_thread(command.downgrade, alembic_config(db_url), "0018")
    holder = await tdb.connect(db_url)
    component = await asyncpg.connect(db_url, server_settings={"lock_timeout": "10000"})
    tables = [r[0] for r in await holder.fetch(
        "SELECT format('conveyor.%I', table_name) FROM information_schema.tables"
        " WHERE table_schema = 'conveyor' AND table_type = 'BASE TABLE'")]  # fmt: skip
    try:
        tr = holder.transaction()
        await tr.start()
        for table in tables:  # ACCESS SHARE on each, kept: whatever the last migration alters
            await holder.fetch(f"SELECT 1 FROM {table} LIMIT 1")
        migrating = asyncio.create_task(asyncio.to_thread(migrate, db_url))
        await asyncio.sleep(0.5)  # the ALTER now waits for its lock
        started = time.monotonic()
        for table in tables:
            await component.fetch(f"SELECT 1 FROM {table} LIMIT 1")
        waited = time.monotonic() - started
        with pytest.raises(MigrationError, match="lock") as caught:
            await asyncio.wait_for(migrating, 30)
        print(f"[migrate] a component's read waited {waited:.1f} s; {caught.value}")
        assert waited < 2.5
        await tr.rollback()
        await asyncio.to_thread(migrate, db_url)  # nothing in the way: done
        version = await component.fetchval("SELECT version_num FROM conveyor.alembic_version")
        assert version == HEAD
    finally:
        await holder.close()
        await component.close()
