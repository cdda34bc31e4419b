"""job_attempts (one row per finished attempt) and the operator views

- ``job_attempts``: written by the statement that finishes an attempt (complete, fail, release,
  lease recovery), never by an extra round trip; the running attempt is read from its ``jobs``
  row. A BRIN index on ``finished_at`` serves the "last hour" views.
- views ``backlog``, ``stuck_jobs``, ``recent_failures``, ``throughput`` (docs/operations.md),
  each served by an index: ``backlog`` walks the distinct types with a skip scan and counts each
  (type, status) range of ``jobs_type_status_id_idx``; ``stuck_jobs`` reads ``jobs_lease_idx``;
  the other two read the last hour of ``job_attempts`` through its BRIN index.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OUTCOMES = "'completed', 'retry', 'failed', 'cancelled', 'released', 'lease_expired'"

VIEWS = {
    "backlog": """
WITH RECURSIVE t(job_type) AS (
    SELECT min(job_type) FROM {s}.jobs
    UNION ALL
    SELECT (SELECT min(j.job_type) FROM {s}.jobs j WHERE j.job_type > t.job_type)
    FROM t WHERE t.job_type IS NOT NULL
)
SELECT t.job_type AS type, st.status, c.count, o.oldest
FROM t
CROSS JOIN unnest(ARRAY['SCHEDULED', 'PENDING', 'RETRYING', 'IN_PROGRESS', 'FAILED']
                  ::{s}.job_status[]) AS st(status)
CROSS JOIN LATERAL (SELECT count(*) AS count FROM {s}.jobs j
                    WHERE j.job_type = t.job_type AND j.status = st.status) c
CROSS JOIN LATERAL (SELECT j.created_at AS oldest FROM {s}.jobs j
                    WHERE j.job_type = t.job_type AND j.status = st.status
                    ORDER BY j.id LIMIT 1) o
WHERE t.job_type IS NOT NULL
""",
    "stuck_jobs": """
SELECT id, job_type AS type, worker_id, attempts AS attempt, started_at, lease_expires_at,
       now() - lease_expires_at AS overdue
FROM {s}.jobs
WHERE status = 'IN_PROGRESS' AND lease_expires_at < now()
""",
    "recent_failures": """
SELECT job_type AS type, error, count(*) AS count, max(finished_at) AS last_seen
FROM {s}.job_attempts
WHERE finished_at > now() - interval '1 hour' AND outcome IN ('retry', 'failed', 'lease_expired')
GROUP BY job_type, error
""",
    "throughput": """
SELECT date_trunc('minute', finished_at) AS minute, job_type AS type,
       count(*) FILTER (WHERE outcome = 'completed') AS completed,
       count(*) FILTER (WHERE outcome = 'failed') AS failed
FROM {s}.job_attempts
WHERE finished_at > now() - interval '1 hour'
GROUP BY 1, 2
""",
}


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    assert schema is not None
    op.create_table(
        "job_attempts",
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_seconds", sa.Float(), nullable=True),
        sa.Column("wait_seconds", sa.Float(), nullable=True),
        sa.CheckConstraint(f"outcome IN ({OUTCOMES})", name="job_attempts_outcome_check"),
        sa.PrimaryKeyConstraint("job_id", "attempt"),
        schema=schema,
    )
    op.create_index(
        "job_attempts_finished_brin",
        "job_attempts",
        ["finished_at"],
        schema=schema,
        postgresql_using="brin",
    )
    for name, body in VIEWS.items():
        op.execute(f"CREATE VIEW {schema}.{name} AS {body.format(s=schema)}")


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    for name in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {schema}.{name}")
    op.drop_table("job_attempts", schema=schema)
