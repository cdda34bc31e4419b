"""``conveyor migrate`` beside a transaction that holds a table it alters. A migration's ALTER
waits for an ACCESS EXCLUSIVE lock, and every later statement on that table queues behind the
waiting ALTER: with no bound of its own, a migration behind one long (or forgotten, or frozen)
transaction stopped every component's use of the table for as long as that transaction lasted
(each component statement failing at its own ``lock_timeout``). The migration waits a few
seconds at a time instead, letting the queue through between tries, and says what blocked it."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import asyncpg
import pytest

from conveyor.store import migrate as migrate_module
from conveyor.store.migrate import MigrationError, migrate, migrations_dir
from conveyor.store.probes import HEAD

from .. import db as tdb

# A later release's migration, as each schema change after a release is: it alters a table.
NEXT = f'''
from alembic import op

revision = "next"
down_revision = "{HEAD}"


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"ALTER TABLE {{schema}}.jobs ADD COLUMN added_later integer")
'''


async def test_a_migration_behind_a_long_transaction_does_not_stall_the_components(
    db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CONVEYOR_MIGRATE_LOCK_TIMEOUT", "1")
    monkeypatch.setenv("CONVEYOR_MIGRATE_TRIES", "3")
    later = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), later, ignore=shutil.ignore_patterns("__pycache__"))
    (later / "versions" / "next_added_later.py").write_text(NEXT)
    monkeypatch.setattr(migrate_module, "migrations_dir", lambda: later)
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
        assert version == "next"
    finally:
        await holder.close()
        await component.close()
