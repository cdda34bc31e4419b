"""``recent_failures`` groups by cause: type, error class and the error's first line

A failed attempt's error is ``Type: message`` then the traceback (``worker/outcomes.describe``),
so grouping by the whole text split one cause raised from two places (or at two line numbers
after a deploy) into rows of one each. The view now groups by the first line and names its
class (``error_class``, NULL for an error that is not an exception's, such as a result too
large), with one recent attempt's job (``last_job_id``) to look at. A ``Retry`` snooze (an
attempt that asked to run later without using up a retry: its error is the single line
``Retry: <reason>``) is not a failure and is left out.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the columns before stay first, in their order (CREATE OR REPLACE VIEW only appends)
BY_CAUSE = """
SELECT job_type AS type, split_part(error, E'\\n', 1) AS error, count(*) AS count,
       max(finished_at) AS last_seen,
       substring(split_part(error, E'\\n', 1) FROM '^([A-Za-z_][A-Za-z0-9_.]*): ') AS error_class,
       (array_agg(job_id ORDER BY finished_at DESC))[1] AS last_job_id
FROM {s}.job_attempts
WHERE finished_at > now() - interval '1 hour' AND outcome IN ('retry', 'failed', 'lease_expired')
  AND NOT (outcome = 'retry' AND error LIKE 'Retry: %' AND strpos(error, E'\\n') = 0)
GROUP BY 1, 2
"""

BEFORE = """
SELECT job_type AS type, error, count(*) AS count, max(finished_at) AS last_seen
FROM {s}.job_attempts
WHERE finished_at > now() - interval '1 hour' AND outcome IN ('retry', 'failed', 'lease_expired')
GROUP BY job_type, error
"""


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    assert schema is not None
    op.execute(f"CREATE OR REPLACE VIEW {schema}.recent_failures AS {BY_CAUSE.format(s=schema)}")


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"DROP VIEW {schema}.recent_failures")  # its grants: `migrate --grant-roles`
    op.execute(f"CREATE VIEW {schema}.recent_failures AS {BEFORE.format(s=schema)}")
