"""Extended statistics on ``jobs`` (job_type, status): the joint frequencies the gauges' estimates
read (docs/monitoring.md)

The gauges count each (type, status) exactly up to a cap and ask the planner above it
(``store/stats.py``). Without these statistics the planner multiplies the frequency of the type
by that of the status, as if they were independent: a type whose jobs all fail, or a backlog
in one type, would be estimated at a fraction of its size. An MCV list on the pair keeps the
joint frequencies of the commonest pairs (up to the statistics target, 100 by default). It is
computed by ANALYZE (autovacuum's, after 2 % of the rows changed: migration 0009) from the same
sample as the columns' statistics, so it costs nothing on a write. ANALYZE once here, so the
estimates are right from the start (a 30,000-row sample: seconds on a big table).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(
        f"CREATE STATISTICS IF NOT EXISTS {schema}.jobs_type_status (mcv) "
        f"ON job_type, status FROM {schema}.jobs"
    )
    op.execute(f"ANALYZE {schema}.jobs")


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"DROP STATISTICS IF EXISTS {schema}.jobs_type_status")
