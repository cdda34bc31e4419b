"""Job type controls (pause, fleet-wide concurrency and rate limits) and job progress

- ``job_types.paused``: a paused type's jobs are accepted and wait (workers stop consuming it).
- ``job_types.concurrency``: at most this many IN_PROGRESS jobs of the type across all workers.
- ``job_types.rate_limit`` / ``rate_period``: at most ``rate_limit`` starts per ``rate_period``
  seconds (a sliding window) across all workers; ``recent_starts`` is the window's log.
- ``job_types.limits_set_at``: set when an operator changed the limits at run time (API/CLI);
  a worker registering the type then keeps them instead of its handler's declaration.
- ``jobs.progress``: ``{"percent", "message", "updated_at"}`` written by the running attempt.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    assert schema is not None
    op.add_column("jobs", sa.Column("progress", pg.JSONB(), nullable=True), schema=schema)
    add = [
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("rate_limit", sa.Integer(), nullable=True),
        sa.Column("rate_period", sa.Integer(), nullable=True),
        sa.Column("limits_set_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "recent_starts",
            pg.ARRAY(sa.DateTime(timezone=True)),
            nullable=False,
            server_default="{}",
        ),
    ]
    for column in add:
        op.add_column("job_types", column, schema=schema)
    op.create_check_constraint(
        "job_types_concurrency_positive", "job_types", "concurrency > 0", schema=schema
    )
    op.create_check_constraint(
        "job_types_rate_positive",
        "job_types",
        "(rate_limit IS NULL) = (rate_period IS NULL) AND rate_limit > 0 AND rate_period > 0",
        schema=schema,
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    for name in ("recent_starts", "limits_set_at", "rate_period", "rate_limit", "concurrency",
                 "paused"):  # fmt: skip
        op.drop_column("job_types", name, schema=schema)
    op.drop_column("jobs", "progress", schema=schema)
