"""workflow_jobs_finished: the outbox rows a release wrote are listed for the completing worker

The release (0021's function otherwise unchanged) adds the ids of the outbox rows it wrote to the
transaction's setting ``<schema>.wf_released`` (comma-separated; local to the transaction, so it
is gone at its end). A worker that completed the jobs reads it in the same transaction
(``job_claim_released``): it claims some of the released jobs itself and deletes their outbox
rows, so they start without a trip through the relay and the broker.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-26
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _beside(name: str) -> ModuleType:
    """A migration of the same directory, wherever the migrations are installed."""
    spec = importlib.util.spec_from_file_location(f"_{name[:4]}", Path(__file__).with_name(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BEFORE = _beside("0021_workflow_finish_check.py").FINISHED

# 0021's text, and what takes its place; each piece occurs exactly once in it.
CHANGES = [
    (
        "    wfs uuid[];\n",
        "    wfs uuid[];\n    outs text;\n",
    ),
    (
        """            SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
        )
        SELECT count(*) FILTER (WHERE status = 'PENDING'), array_agg(DISTINCT workflow_id)
        INTO released, waiting FROM r;
        IF released > 0 THEN
            PERFORM pg_notify('{s}_outbox', '');
        END IF;""",
        """            SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
            RETURNING id
        )
        SELECT count(*) FILTER (WHERE status = 'PENDING'), array_agg(DISTINCT workflow_id),
               (SELECT string_agg(ob.id::text, ',') FROM ob)
        INTO released, waiting, outs FROM r;
        IF released > 0 THEN
            PERFORM pg_notify('{s}_outbox', '');
            -- the outbox rows written, for the completing worker (job_claim_released)
            PERFORM set_config('{s}.wf_released', concat_ws(',',
                NULLIF(current_setting('{s}.wf_released', true), ''), outs), true);
        END IF;""",
    ),
]


def _changed(text: str) -> str:
    for old, new in CHANGES:
        if text.count(old) != 1:
            raise RuntimeError(f"0021's function text changed: {old[:60]!r}")
        text = text.replace(old, new)
    return text


FINISHED = _changed(BEFORE)


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(FINISHED.format(s=schema))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(BEFORE.format(s=schema))
