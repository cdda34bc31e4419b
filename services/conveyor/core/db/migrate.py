"""``conveyor migrate``: create the database when missing, then ``alembic upgrade head``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

from .connect import ensure_database


def migrations_dir() -> Path:
    """Installed wheels carry the migrations inside the package; a source checkout has them at
    the repository root."""
    here = Path(__file__).resolve()
    packaged = here.parents[2] / "_migrations"
    if packaged.is_dir():
        return packaged
    return here.parents[4] / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Blocking: runs alembic (which runs its own event loop). Call from a thread in async code."""
    command.upgrade(alembic_config(url), revision)


def migrate(url: str) -> bool:
    """Create the database if needed and upgrade it. Returns True when the database was created."""
    created = asyncio.run(ensure_database(url))
    upgrade(url)
    return created
