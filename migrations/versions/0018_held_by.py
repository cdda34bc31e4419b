"""jobs.held_by: the worker holding a waiting job in its hand (held for a full concurrency
limit, its delivery acknowledged). The lease sweep publishes again the jobs of a hand whose hold
ran out (the holder frozen or dead) instead of leaving them to the reconciler; the partial index
keeps that pass to the held jobs.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.add_column("jobs", sa.Column("held_by", sa.Text()), schema=schema)
    op.create_index(
        "jobs_hand_idx",
        "jobs",
        ["lease_expires_at"],
        schema=schema,
        postgresql_where=sa.text("held_by IS NOT NULL AND status IN ('PENDING', 'RETRYING')"),
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_index("jobs_hand_idx", "jobs", schema=schema)
    op.drop_column("jobs", "held_by", schema=schema)
