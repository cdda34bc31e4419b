"""job_types (the types workers registered, with their handlers' defaults) and the attempt a
dead-letter outbox row records

- ``job_types``: one row per job type a worker (or a deploy step) registered, with the handler's
  ``max_retries``, ``timeout_seconds`` and ``retry_delays``; the API accepts only these types
  (unless ``CONVEYOR_ACCEPT_UNKNOWN_TYPES``), so queues and metric series stay bounded by what
  operators deploy.
- ``job_outbox.attempt``: the attempt a dead letter recorded, so a redrive from the dead-letter
  queue is fenced (it revives the job only while it is still in that failure).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    now = sa.text("now()")
    op.create_table(
        "job_types",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("max_retries", sa.Integer(), nullable=True),
        sa.Column("timeout_seconds", sa.Float(), nullable=True),
        sa.Column("retry_delays", pg.ARRAY(sa.Integer()), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False, server_default=now),
        schema=schema,
    )
    op.add_column("job_outbox", sa.Column("attempt", sa.Integer(), nullable=True), schema=schema)


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_column("job_outbox", "attempt", schema=schema)
    op.drop_table("job_types", schema=schema)
