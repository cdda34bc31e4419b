"""Unique jobs, job metadata and schedules

- ``job_uniques``: one row per unique key (``unique_for`` / ``unique_key`` on submit and the
  tick of a schedule) naming the job that holds it until ``expires_at``. The submit statement
  claims the key with ``INSERT … ON CONFLICT (key) DO UPDATE … WHERE expires_at <= now()``, so
  PostgreSQL decides which of several concurrent submits wins; the others return its job.
  Expired rows are deleted by the retention duty (``job_uniques_expires_idx``).
- ``jobs.meta``: a small JSON object set at submit (≤ 8 KiB), returned in the job resource and
  handed to handlers as ``job.meta``; NULL when not given (no cost on the hot path).
- ``schedules``: cron (5 fields, a time zone) or ``every_seconds`` schedules; the sweeper locks
  the due ones (``schedules_due_idx``) and enqueues one job per tick, each with the unique key
  ``schedule/<name>/<tick>``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    now = sa.text("now()")
    op.add_column("jobs", sa.Column("meta", pg.JSONB(), nullable=True), schema=schema)
    op.create_table(
        "job_uniques",
        sa.Column("key", sa.Text(), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        schema=schema,
    )
    op.create_index("job_uniques_expires_idx", "job_uniques", ["expires_at"], schema=schema)
    op.create_table(
        "schedules",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("payload", pg.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("every_seconds", sa.Float(), nullable=True),
        sa.Column("timezone", sa.Text(), nullable=False, server_default="UTC"),
        sa.Column("priority", sa.SmallInteger(), nullable=False, server_default="5"),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("catch_up", sa.Text(), nullable=False, server_default="skip"),
        sa.Column("source", sa.Text(), nullable=False, server_default="api"),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_tick_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", pg.UUID(as_uuid=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="schedules_one_rule"),
        sa.CheckConstraint("catch_up IN ('skip', 'last')", name="schedules_catch_up_check"),
        sa.CheckConstraint("source IN ('api', 'code')", name="schedules_source_check"),
        sa.CheckConstraint("priority BETWEEN 0 AND 9", name="schedules_priority_range"),
        schema=schema,
    )
    op.create_index(
        "schedules_due_idx",
        "schedules",
        ["next_run_at"],
        schema=schema,
        postgresql_where=sa.text("enabled"),
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_index("schedules_due_idx", table_name="schedules", schema=schema)
    op.drop_table("schedules", schema=schema)
    op.drop_index("job_uniques_expires_idx", table_name="job_uniques", schema=schema)
    op.drop_table("job_uniques", schema=schema)
    op.drop_column("jobs", "meta", schema=schema)
