"""Tables of the job features (migration 0007): unique keys and schedules. Kept apart from
``schema.py`` so each stays short; ``metadata_for`` calls ``define_features``."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg


def define_features(metadata: sa.MetaData) -> None:
    # A unique key (``unique_for`` on submit, a schedule's tick) and the job holding it until
    # ``expires_at``; the submit statement takes an expired key over (``store/jobs.py``).
    uniques = sa.Table(
        "job_uniques",
        metadata,
        sa.Column("key", sa.Text(), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    sa.Index("job_uniques_expires_idx", uniques.c.expires_at)

    now = sa.func.now()
    schedules = sa.Table(
        "schedules",
        metadata,
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("payload", pg.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("every_seconds", sa.Float(), nullable=True),
        sa.Column("timezone", sa.Text(), nullable=False, server_default="UTC"),
        sa.Column("priority", sa.SmallInteger(), nullable=False, server_default="5"),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        # ticks missed while no sweeper ran: skip them, or run the last one
        sa.Column("catch_up", sa.Text(), nullable=False, server_default="skip"),
        # api: POST /schedules or the CLI; code: ``schedule=`` / ``every=`` on a handler
        sa.Column("source", sa.Text(), nullable=False, server_default="api"),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_tick_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", pg.UUID(as_uuid=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="schedules_one_rule"),
        sa.CheckConstraint("catch_up IN ('skip', 'last')", name="schedules_catch_up_check"),
        sa.CheckConstraint("source IN ('api', 'cli', 'code')", name="schedules_source_check"),
        sa.CheckConstraint("priority BETWEEN 0 AND 9", name="schedules_priority_range"),
    )
    sa.Index(
        "schedules_due_idx",
        schedules.c.next_run_at,
        postgresql_where=schedules.c.enabled,
    )
