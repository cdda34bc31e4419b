"""api_rate: the fleet-wide token bucket behind ``CONVEYOR_RATE_LIMIT`` (docs/security.md).

One row per key that submitted (``anonymous`` with auth disabled): ``tokens`` left at ``at``;
``granted`` is what the last take handed out (returned by the same statement). An API process
takes a chunk of tokens at a time (``api.ratelimit``), so the table is touched at most once per
key per chunk, and a refused key at most once per key per short window. UNLOGGED: after a
crash the buckets start full again, which only forgives a burst.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(
        f"CREATE UNLOGGED TABLE {schema}.api_rate (key_id text PRIMARY KEY, "
        "tokens float8 NOT NULL, granted float8 NOT NULL, at timestamptz NOT NULL)"
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_table("api_rate", schema=schema)
