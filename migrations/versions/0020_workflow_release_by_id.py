"""workflow_jobs_finished counts a statement's dependents down by id, whatever the statistics

The release (migration 0016's ``workflow_jobs_finished``) joined the dependents' counts,
``unnest(children, counts)``, to ``jobs`` with ``c.status = 'WAITING'`` in the join. An ANALYZE
taken while no job was WAITING (a deployment's usual state) estimates that test at one row, and
the planner then scanned ``jobs`` and ran the whole ``unnest`` once per row it kept: n x n for a
fan-out of n (287 ms for the 1,000 dependents of one root on a 25,000-row table, every
completion of a fan-out's root). Here the status test is a CASE, which no statistic estimates,
so the counts drive the join (a hash of them, or the primary key per child): linear in n. The
rows were locked, in id order, by the statement before it, which tests WAITING the same way.

The finished jobs' workflows (for the test that finishes a workflow) are read by primary key,
one lookup per job: as ``j.id = ANY(done)`` a never-analyzed ``jobs`` (a fresh install) was
scanned whole by every completion statement of a workflow job.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0016's texts (its open statuses, the derived status; its function for the downgrade), from
# the file beside this one, wherever the migrations are installed
_spec = importlib.util.spec_from_file_location(
    "_0016", Path(__file__).with_name("0016_workflows.py")
)
assert _spec is not None and _spec.loader is not None
_0016 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_0016)
OPEN, DERIVED = _0016.OPEN, _0016.DERIVED

FINISHED = f"""
CREATE OR REPLACE FUNCTION {{s}}.workflow_jobs_finished() RETURNS trigger LANGUAGE plpgsql
AS $fn$
DECLARE
    done uuid[];
    children uuid[];
    counts int[];
    released int;
BEGIN
    done := string_to_array(NULLIF(current_setting('{{s}}.wf_finished', true), ''), ',')::uuid[];
    IF done IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('{{s}}.wf_finished', '', true);
    SELECT array_agg(x.job_id ORDER BY x.job_id), array_agg(x.n ORDER BY x.job_id)
    INTO children, counts
    FROM (SELECT d.job_id, count(*)::int AS n FROM {{s}}.job_dependencies d
          WHERE d.depends_on = ANY(done) GROUP BY d.job_id) x;
    IF children IS NOT NULL THEN
        PERFORM 1 FROM {{s}}.jobs c WHERE c.id = ANY(children)
            AND CASE c.status WHEN 'WAITING' THEN true ELSE false END
        ORDER BY c.id FOR UPDATE;
        WITH r AS (
            UPDATE {{s}}.jobs c SET
                deps_pending = c.deps_pending - k.n,
                status = (CASE WHEN c.deps_pending > k.n THEN 'WAITING'
                               WHEN c.run_at > now() THEN 'SCHEDULED'
                               ELSE 'PENDING' END)::{{s}}.job_status,
                run_at = CASE WHEN c.deps_pending > k.n OR c.run_at > now() THEN c.run_at
                              ELSE now() END,
                updated_at = CASE WHEN c.deps_pending > k.n THEN c.updated_at ELSE now() END
            FROM unnest(children, counts) AS k(id, n)
            WHERE c.id = k.id AND CASE c.status WHEN 'WAITING' THEN true ELSE false END
            RETURNING c.id, c.job_type, c.priority, c.status
        ), ob AS (
            INSERT INTO {{s}}.job_outbox (job_id, job_type, priority)
            SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
        )
        SELECT count(*) FILTER (WHERE status = 'PENDING') INTO released FROM r;
        IF released > 0 THEN
            PERFORM pg_notify('{{s}}_outbox', '');
        END IF;
    END IF;
    UPDATE {{s}}.workflows w SET status = {DERIVED.format(s="{s}")},
        finished_at = COALESCE(w.finished_at, now())
    WHERE w.id = ANY(ARRAY(SELECT DISTINCT (SELECT j.workflow_id FROM {{s}}.jobs j
                                            WHERE j.id = x.id)
                           FROM unnest(done) AS x(id)))
      AND NOT EXISTS (SELECT 1 FROM {{s}}.jobs x WHERE x.workflow_id = w.id
                      AND x.status IN ({OPEN}))
      AND w.status <> {DERIVED.format(s="{s}")};
    RETURN NULL;
END
$fn$
"""


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(FINISHED.format(s=schema))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    old = _0016.FINISHED.format(s=schema)
    op.execute(old.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
