"""Conveyor's own schema: no change to the database

Revisions 0001 and 0002 already create every object in ``CONVEYOR_DB_SCHEMA``
(``migrations/env.py`` runs them with that schema as the search path), so this revision does
nothing; it stays so that the chain of revisions is unbroken.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from collections.abc import Sequence

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing to do: see the module docstring."""


def downgrade() -> None:
    """Nothing to undo."""
