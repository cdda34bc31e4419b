"""jobs.trace_context: the W3C ``traceparent`` of the request (or transaction) that submitted the
job, so every attempt's span joins that trace (docs/monitoring.md). Nullable, no index: it is
read only with the row (the claim, the relay's traced take).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.add_column("jobs", sa.Column("trace_context", sa.Text(), nullable=True), schema=schema)


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_column("jobs", "trace_context", schema=schema)
