"""api_keys: API keys with scopes (docs/security.md)

- ``key_id``: the key's short public id (``cvk_<key_id>_<secret>``); a request's key is looked
  up by it, then its SHA-256 is compared in constant time with ``key_hash``. The key itself is
  never stored: ``conveyor keys create`` prints it once.
- ``name`` is unique among keys that are not revoked, so a rotation creates the new key under a
  new name, moves clients, then revokes the old one (``revoked_at``; rows stay for the record).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("key_hash", sa.LargeBinary(), nullable=False),
        sa.Column("scopes", pg.ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("octet_length(key_hash) = 32", name="api_keys_hash_length"),
        schema=schema,
    )
    op.create_index(
        "api_keys_active_name_idx",
        "api_keys",
        ["name"],
        unique=True,
        schema=schema,
        postgresql_where=sa.text("revoked_at IS NULL"),
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_table("api_keys", schema=schema)
