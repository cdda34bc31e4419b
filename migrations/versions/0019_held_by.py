"""jobs.held_by / held_since: the worker holding a waiting job in its hand (held for a full
concurrency limit, its delivery acknowledged), and since when. The lease sweep publishes again
the jobs of a hand whose hold ran out (the holder frozen or dead) instead of leaving them to the
reconciler; other workers' claims take a job held longer than its holder's retries (a slot
freed on a busy worker no longer starves another worker's hand). The partial index keeps both
reads to the held jobs.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.add_column("jobs", sa.Column("held_by", sa.Text()), schema=schema)
    op.add_column("jobs", sa.Column("held_since", sa.DateTime(timezone=True)), schema=schema)
    op.create_index(
        "jobs_hand_idx",
        "jobs",
        ["lease_expires_at"],
        schema=schema,
        postgresql_where=sa.text("held_by IS NOT NULL"),
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_index("jobs_hand_idx", "jobs", schema=schema)
    op.drop_column("jobs", "held_since", schema=schema)
    op.drop_column("jobs", "held_by", schema=schema)
