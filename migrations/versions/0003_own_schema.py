"""Conveyor's own schema: a round-one install moves from ``public``

Fresh installs already created everything in ``CONVEYOR_DB_SCHEMA`` (``migrations/env.py`` runs
the earlier revisions with that schema as the search path). On an install from before schemas
(tables, type and indexes in ``public``, version row in ``public.alembic_version``), the
migration's pre-step (``conveyor.store.legacy.prepare``) recognised the layout and handed the
version row to the schema's version table; this revision moves the tables with their rows,
indexes, constraints and identity sequence, and the status type. Nothing else in ``public`` is
touched.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from collections.abc import Sequence

from alembic import op

from conveyor.store.legacy import move_from_public

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    assert schema is not None
    move_from_public(op.get_bind(), schema)


def downgrade() -> None:
    """Tables stay in the schema: moving them back to ``public`` could collide with an
    application's own tables."""
