"""Indexes for ``GET /workflows`` filtered on many workflows: ``workflows_status_id_idx``
(status, id) and ``workflows_name_id_idx`` (name, id). A page is newest first by id (the keyset
cursor); with a status or a name that few workflows have, the walk down the primary key read
(nearly) every workflow to fill a page, and the planner chose a sequential scan and a sort
instead (``tests/integration/test_explain.py``). With them a filtered page reads its own id
range. A workflow's row is written once per status change, so each costs one index entry more
per write.

Built with ``CREATE INDEX CONCURRENTLY`` outside the migration's transaction (Alembic's
autocommit block), as 0009 builds those of ``jobs``: a big table keeps taking submits meanwhile;
a build that failed half-way leaves an INVALID index behind, dropped and built again.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {"workflows_status_id_idx": "(status, id)", "workflows_name_id_idx": "(name, id)"}


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
        for name, columns in INDEXES.items():
            _drop_invalid(schema, name)
            op.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {schema}.workflows {columns}"
            )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    with op.get_context().autocommit_block():
        for name in reversed(INDEXES):
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{name}")
