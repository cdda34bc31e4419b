"""schedules.source may be ``cli``: a schedule made by ``conveyor schedules add`` says so
(it said ``api``). A run-time schedule either way: the CLI's replace any schedule of its name,
like the API's; only a handler's (``code``) is special.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.drop_constraint("schedules_source_check", "schedules", schema=schema, type_="check")
    op.create_check_constraint(
        "schedules_source_check", "schedules", "source IN ('api', 'cli', 'code')", schema=schema
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"UPDATE {schema}.schedules SET source = 'api' WHERE source = 'cli'")
    op.drop_constraint("schedules_source_check", "schedules", schema=schema, type_="check")
    op.create_check_constraint(
        "schedules_source_check", "schedules", "source IN ('api', 'code')", schema=schema
    )
