"""workflow_jobs_finished: the release listing holds the last releasing statement's rows only

0022 appended each release's outbox rows to ``<schema>.wf_released``, so every release statement
of a transaction copied the whole list so far: quadratic in a long transaction's releases (an
operator's loop of 60,000 completions in one transaction took 45 s instead of 25 s). The
worker's claim (``job_claim_released``) reads the list right after its one completion statement,
so the rows of that statement are all it needs: each release now sets the list to its own rows.
(A list that misses rows costs nothing but speed: a released job that is not listed goes through
the relay.)

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-26
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _beside(name: str) -> ModuleType:
    """A migration of the same directory, wherever the migrations are installed."""
    spec = importlib.util.spec_from_file_location(f"_{name[:4]}", Path(__file__).with_name(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BEFORE = _beside("0022_released_outbox_rows.py").FINISHED

# 0022's text, and what takes its place (it occurs exactly once in it).
OLD = """            -- the outbox rows written, for the completing worker (job_claim_released)
            PERFORM set_config('{s}.wf_released', concat_ws(',',
                NULLIF(current_setting('{s}.wf_released', true), ''), outs), true);"""
NEW = """            -- the outbox rows this statement wrote, for the completing worker's claim
            -- after it (job_claim_released); replaced, not appended to: a transaction of
            -- many releases would copy the growing list at each
            PERFORM set_config('{s}.wf_released', outs, true);"""

if BEFORE.count(OLD) != 1:
    raise RuntimeError("0022's function text changed")
FINISHED = BEFORE.replace(OLD, NEW)


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(FINISHED.format(s=schema))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(BEFORE.format(s=schema))
