"""workflows.idempotency_key / request_hash: ``POST /workflows`` with an ``Idempotency-Key``
answers a replay (same key, same body) with the first workflow and a different body with 409,
as ``POST /jobs`` does. The key goes with its workflow (retention deletes both).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.add_column("workflows", sa.Column("idempotency_key", sa.Text()), schema=schema)
    op.add_column("workflows", sa.Column("request_hash", sa.Text()), schema=schema)
    op.create_index(
        "workflows_idempotency_key_idx",
        "workflows",
        ["idempotency_key"],
        unique=True,
        schema=schema,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_index("workflows_idempotency_key_idx", "workflows", schema=schema)
    op.drop_column("workflows", "request_hash", schema=schema)
    op.drop_column("workflows", "idempotency_key", schema=schema)
