"""Indexes for tens of millions of jobs, built CONCURRENTLY, and autovacuum settings for ``jobs``

- ``jobs_done_idx`` (finished_at) WHERE status IN ('COMPLETED', 'CANCELLED') and
  ``jobs_failed_idx`` (finished_at) WHERE status = 'FAILED' replace ``jobs_finished_idx``
  (finished_at): retention deletes the oldest of each first (COMPLETED/CANCELLED after
  ``CONVEYOR_RETENTION_DAYS``, FAILED after ``CONVEYOR_FAILED_RETENTION_DAYS``), and an idle pass
  no longer walks the FAILED jobs kept longer than the finished ones. A row is in one of them at
  most, so writes cost what they did.
- ``jobs_waiting_idx`` (updated_at, job_type) WHERE status IN ('PENDING', 'RETRYING'): the
  reconciler's overdue count was a parallel sequential scan (~110 ms at 1M rows, every pass).
- Autovacuum for ``jobs`` (docs/scaling.md): every status change leaves a dead row version
  (status is indexed, so no update is HOT); the default 20 % scale factor lets 2M dead rows
  pile up at 10M rows before a vacuum, bloating the hot indexes and clearing the visibility map
  the index-only counts rely on. Vacuum after 1 % (+1,000), analyze after 2 % (+1,000), an
  insert-driven vacuum after 5 % (+10,000) new rows, and a higher cost limit so one vacuum of
  a large table finishes in minutes, not hours.

Every index on ``jobs`` is built with ``CREATE INDEX CONCURRENTLY`` outside the migration's
transaction (Alembic's autocommit block), so a big table keeps taking writes meanwhile. A build
that failed half-way leaves an INVALID index behind: it is dropped and built again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-22
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "jobs_done_idx": (
        "(finished_at) WHERE status = ANY (ARRAY['COMPLETED'::{s}.job_status, "
        "'CANCELLED'::{s}.job_status])"
    ),
    "jobs_failed_idx": "(finished_at) WHERE status = 'FAILED'::{s}.job_status",
    "jobs_waiting_idx": (
        "(updated_at, job_type) WHERE status = ANY (ARRAY['PENDING'::{s}.job_status, "
        "'RETRYING'::{s}.job_status])"
    ),
}

AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_analyze_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0.05",
    "autovacuum_vacuum_insert_threshold": "10000",
    "autovacuum_vacuum_cost_limit": "2000",
}


def _drop_invalid(schema: str, name: str) -> None:
    op.execute(
        f"""DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = '{schema}' AND c.relname = '{name}' AND NOT i.indisvalid) THEN
        EXECUTE 'DROP INDEX {schema}.{name}';
    END IF;
END $$"""
    )


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    assert schema is not None
    with op.get_context().autocommit_block():
        for name, definition in INDEXES.items():
            _drop_invalid(schema, name)
            op.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {schema}.jobs "
                + definition.format(s=schema)
            )
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.jobs_finished_idx")
    settings = ", ".join(f"{k} = {v}" for k, v in AUTOVACUUM.items())
    op.execute(f"ALTER TABLE {schema}.jobs SET ({settings})")


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"ALTER TABLE {schema}.jobs RESET ({', '.join(AUTOVACUUM)})")
    with op.get_context().autocommit_block():
        op.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_finished_idx ON {schema}.jobs "
            "(finished_at) WHERE finished_at IS NOT NULL"
        )
        for name in reversed(INDEXES):
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{name}")
