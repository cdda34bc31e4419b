"""Baseline: the whole schema as the files of ``conveyor/store/sql/schema/`` describe it.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

from conveyor.store.schema import schema_statements

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTIONS = (
    "retry_job(uuid)",
    "cancel_job(uuid)",
    "cancel_workflow(uuid)",
    "claimed_parents(uuid[])",
    "take_released(text[], int)",
    "workflow_downstream(uuid)",
    "workflow_outcome(uuid, boolean)",
    "workflow_job_settled()",
    "workflow_jobs_finished()",
    "workflow_job_redriven()",
    "admissible(text)",
    "admit(text, int, boolean)",
    "admission_wait()",
    "ordered_place()",
)
TABLES = (
    "jobs",
    "job_outbox",
    "job_attempts",
    "job_uniques",
    "job_types",
    "schedules",
    "api_keys",
    "api_rate",
    "workflows",
    "job_dependencies",
    "partitions",
)


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    assert schema is not None
    for statement in schema_statements(schema):
        op.execute(statement)


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    # the tables take their views, triggers, statistics and the functions of their row types
    # with them
    op.execute(f"DROP TABLE {', '.join(f'{schema}.{t}' for t in TABLES)} CASCADE")
    op.execute(f"DROP FUNCTION {', '.join(f'{schema}.{f}' for f in FUNCTIONS)}")
    op.execute(f"DROP TYPE {schema}.job_status")
