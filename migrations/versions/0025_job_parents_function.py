"""job_parents(id): a workflow job's dependencies as its handler sees them, read by index always

The claim returns each claimed workflow job's dependencies (key -> status and result) with a
lookup per dependency. Written in the claim statement itself, the lookup was planned with the
statement: asyncpg keeps the claim prepared on each connection and PostgreSQL moves it to a
generic plan after five runs, so a worker whose connection planned it while ``jobs`` was small
(a fresh install's first minutes) read ``jobs`` whole once per dependency of every fan-in it
claimed, until an ANALYZE invalidated the plan: a 2,000-parent join's claim took a second at
12,000 rows (13 ms in a fresh session). The lookup is now this function, which the claim calls
per claimed workflow job: a SQL function with a ``SET`` clause is never inlined, its query is
planned afresh for each statement that calls it, and ``enable_seqscan`` is off while it runs,
so each dependency and each parent is found by its primary key whatever the statistics.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-26
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# ``OFFSET 0`` keeps the inner query a query of its own: flattened, its lookup is copied into
# each of the three uses of ``x.p``. A dependency whose job row is gone (retention never deletes
# a running workflow's rows, an operator might) is left out.
PARENTS = """
CREATE OR REPLACE FUNCTION {s}.job_parents(uuid) RETURNS text
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $fn$
SELECT jsonb_object_agg(x.p ->> 'key', x.p - 'key')::text
FROM (SELECT (SELECT jsonb_build_object('key', p.workflow_key, 'status', p.status,
                                        'result', p.result)
              FROM {s}.jobs p WHERE p.id = d.depends_on) AS p
      FROM {s}.job_dependencies d WHERE d.job_id = $1 OFFSET 0) x
WHERE x.p IS NOT NULL
$fn$
"""


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(PARENTS.format(s=schema))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"DROP FUNCTION {schema}.job_parents(uuid)")
