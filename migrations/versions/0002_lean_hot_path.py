"""lean hot path: fewer index entries per job version, no NOTIFY trigger

Every status change rewrites the row (``status`` is indexed, so updates cannot be HOT), and
each index then takes a new entry. This revision keeps only the indexes the hot path and the
operator queries need:

- ``jobs_created_idx`` goes: ids are UUIDv7 (time-ordered), so keyset pages order by ``id``.
- ``jobs_type_status_created_idx`` becomes ``jobs_type_status_id_idx``.
- the idempotency key's unique index becomes partial (most jobs have no key).
- ``job_outbox_job_id_idx`` goes: the outbox stays small; the reconciler's anti-join hashes it.
- the statement-level NOTIFY trigger goes: ``pg_notify`` takes a database-wide lock held through
  the commit's WAL flush, which serialised concurrent submits. Writers now notify explicitly
  (the API coalesces its notifications; ``enqueue`` notifies in the caller's transaction).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_outbox_notify ON job_outbox")
    op.execute("DROP FUNCTION IF EXISTS conveyor_outbox_notify()")
    op.drop_index("jobs_created_idx", table_name="jobs")
    op.drop_index("jobs_type_status_created_idx", table_name="jobs")
    op.create_index("jobs_type_status_id_idx", "jobs", ["job_type", "status", "id"])
    op.drop_constraint("jobs_idempotency_key_key", "jobs", type_="unique")
    op.create_index(
        "jobs_idempotency_key_idx",
        "jobs",
        ["idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.drop_index("job_outbox_job_id_idx", table_name="job_outbox")


def downgrade() -> None:
    op.create_index("job_outbox_job_id_idx", "job_outbox", ["job_id"])
    op.drop_index("jobs_idempotency_key_idx", table_name="jobs")
    op.create_unique_constraint("jobs_idempotency_key_key", "jobs", ["idempotency_key"])
    op.drop_index("jobs_type_status_id_idx", table_name="jobs")
    op.create_index(
        "jobs_type_status_created_idx", "jobs", ["job_type", "status", "created_at", "id"]
    )
    op.create_index("jobs_created_idx", "jobs", ["created_at", "id"])
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
