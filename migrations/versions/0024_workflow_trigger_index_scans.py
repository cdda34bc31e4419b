"""workflow_jobs_finished: its statements never read ``jobs`` by a sequential scan

0021 set ``plan_cache_mode`` so the trigger's statements run on generic plans, each planned once
per session. A generic plan is planned with the table's statistics of that moment, and a table
that was small then (a fresh install, a database whose ``jobs`` autovacuum had not analyzed yet)
gets a plan that reads it whole: the count-down of a fan-in's dependent ran as a hash join over
a sequential scan of ``jobs``, about 0.2 ms per thousand rows, for every statement that completed
some of its parents (each batch of a 1,000-leaf fan-out's completions), and the session kept
that plan until an ANALYZE invalidated it. Every statement of the function finds its rows by an
index (dependents and workflows by primary key, dependencies by ``depends_on``, open jobs by
``jobs_workflow_idx``), so ``enable_seqscan`` is off for them, set and set back as
``plan_cache_mode`` is.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-26
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _beside(name: str) -> ModuleType:
    """A migration of the same directory, wherever the migrations are installed."""
    spec = importlib.util.spec_from_file_location(f"_{name[:4]}", Path(__file__).with_name(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BEFORE = _beside("0023_released_rows_of_the_statement.py").FINISHED

# 0023's text, and what takes the place of each part (each occurs exactly once in it).
CHANGES = [
    (
        "    mode text;\n",
        "    mode text;\n    seqscan text;\n",
    ),
    (
        """    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);\n""",
        """    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    -- and each by an index, whatever the statistics were when it was planned
    seqscan := current_setting('enable_seqscan');
    PERFORM set_config('enable_seqscan', 'off', true);\n""",
    ),
    (
        """    PERFORM set_config('plan_cache_mode', mode, true);\n""",
        """    PERFORM set_config('plan_cache_mode', mode, true);
    PERFORM set_config('enable_seqscan', seqscan, true);\n""",
    ),
]


def _changed(text: str) -> str:
    for old, new in CHANGES:
        if text.count(old) != 1:
            raise RuntimeError(f"0023's function text changed: {old!r}")
        text = text.replace(old, new)
    return text


FINISHED = _changed(BEFORE)


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(FINISHED.format(s=schema))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(BEFORE.format(s=schema))
