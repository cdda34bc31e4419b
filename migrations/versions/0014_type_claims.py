"""type_claims: the claims of a concurrency-limited type, recorded on its ``job_types`` row.

``job_claim_controlled`` is one statement that locks the type rows for its own duration only
(a worker frozen between two statements of a transaction kept the lock and wedged the type
fleet-wide). A statement's snapshot predates its lock, so claims committed while it waited are
invisible in ``jobs``; the type row, read with ``FOR UPDATE``, is its newest version, and the
claims recorded there (id, attempt) make the count exact (``store/controls.py``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(
        f"ALTER TABLE {schema}.job_types ADD COLUMN claim_ids uuid[] NOT NULL DEFAULT '{{}}', "
        "ADD COLUMN claim_attempts int4[] NOT NULL DEFAULT '{}'"
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"ALTER TABLE {schema}.job_types DROP COLUMN claim_ids, DROP COLUMN claim_attempts")
