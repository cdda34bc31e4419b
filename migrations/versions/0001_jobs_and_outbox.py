"""jobs, job_outbox, job_status and the outbox NOTIFY trigger

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("PENDING", "SCHEDULED", "IN_PROGRESS", "RETRYING", "COMPLETED", "FAILED", "CANCELLED")


def upgrade() -> None:
    job_status = pg.ENUM(*STATUSES, name="job_status", create_type=False)
    job_status.create(op.get_bind(), checkfirst=False)
    now = sa.text("now()")
    op.create_table(
        "jobs",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("status", job_status, nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("payload", pg.JSONB(), nullable=False),
        sa.Column("result", pg.JSONB(), nullable=True),
        sa.Column("max_retries", sa.Integer(), nullable=True),
        sa.Column("timeout_seconds", sa.Float(), nullable=True),
        sa.Column("retry_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("priority BETWEEN 0 AND 9", name="jobs_priority_range"),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="jobs_payload_object"),
        sa.UniqueConstraint("idempotency_key", name="jobs_idempotency_key_key"),
    )
    op.create_index(
        "jobs_type_status_created_idx", "jobs", ["job_type", "status", "created_at", "id"]
    )
    op.create_index("jobs_created_idx", "jobs", ["created_at", "id"])
    op.create_index(
        "jobs_due_idx",
        "jobs",
        ["run_at"],
        postgresql_where=sa.text("status IN ('SCHEDULED', 'RETRYING')"),
    )
    op.create_index(
        "jobs_lease_idx",
        "jobs",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'IN_PROGRESS'"),
    )
    op.create_index(
        "jobs_finished_idx",
        "jobs",
        ["finished_at"],
        postgresql_where=sa.text("finished_at IS NOT NULL"),
    )

    op.create_table(
        "job_outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("destination", sa.Text(), nullable=False, server_default="work"),
        sa.Column("delay_seconds", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.CheckConstraint(
            "destination IN ('work', 'retry', 'dead')", name="job_outbox_destination_check"
        ),
    )
    op.create_index("job_outbox_job_id_idx", "job_outbox", ["job_id"])

    # Wake publishers at commit. Statement-level, and NOTIFY folds identical notifications within
    # a transaction, so a 1,000-job batch sends one.
    op.execute(
        """
        CREATE FUNCTION conveyor_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('conveyor_outbox', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER job_outbox_notify AFTER INSERT ON job_outbox
        FOR EACH STATEMENT EXECUTE FUNCTION conveyor_outbox_notify()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_outbox_notify ON job_outbox")
    op.execute("DROP FUNCTION IF EXISTS conveyor_outbox_notify()")
    op.drop_table("job_outbox")
    op.drop_table("jobs")
    op.execute("DROP TYPE IF EXISTS job_status")
