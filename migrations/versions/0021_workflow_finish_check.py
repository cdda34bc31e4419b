"""workflow_jobs_finished: the finish test reads only the workflows that may have finished

Every statement that finished workflow jobs ran, after the count-down, one ``UPDATE workflows``
whose filter computed the workflow's derived status (its two ``EXISTS`` tests) before the test
for an open job. The planner may turn those ``EXISTS`` into hashed subplans: every FAILED job of
the table, and through ``jobs_done_idx`` every COMPLETED and CANCELLED one, read by every such
statement to build the hash (a cost growing with the table), while nearly always a job of the
workflow was still open.

Now, in this order, each step only for what the previous one left:

- a workflow with a dependent counted down by this statement is left out: that dependent is
  open (``WAITING``, ``PENDING`` or ``SCHEDULED``, locked by this transaction), so the workflow
  cannot have finished. A chain's link and a fan-out's root and leaves stop here.
- a workflow with an open job is left out, each tested by one probe of ``jobs_workflow_idx``
  (a scalar subquery, which the planner cannot hash).
- the rest are finished with their derived status, each ``EXISTS`` a probe of the same index;
  the update tests again for an open job in its own snapshot, as before.

A statement with a single dependent to count down (a chain's link, a fan-out's leaf) no longer
locks it by a statement of its own first: the locks in id order prevent deadlocks between
statements each locking several rows; one row's update waits for it as the lock would, and
counts down its latest version.

The trigger's own statements run on their generic plans (``plan_cache_mode`` set for them, and
set back before the function returns; an error rolls it back with the transaction or the
savepoint): each is planned once per session instead of at every call, where a custom plan for
each statement's arrays cost about as much as running it; the generic plans find every row by
an index (the release's dependents by primary key, where a custom plan for many of them could
hash-join a scan of ``jobs``).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-26
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _beside(name: str) -> ModuleType:
    """A migration of the same directory, wherever the migrations are installed."""
    spec = importlib.util.spec_from_file_location(f"_{name[:4]}", Path(__file__).with_name(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OPEN = "'WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING'"

# One probe of ``jobs_workflow_idx``: whether the workflow ``{w}`` has a job of status ``{st}``.
# A scalar subquery is run per row; an ``EXISTS`` may become a hashed subplan reading every job
# of that status in the table.
HAS = """(SELECT true FROM {{s}}.jobs x WHERE x.workflow_id = {w} AND x.status IN ({st})
        LIMIT 1)"""

# The workflow's status from its jobs once none is open (0016's, by probes).
DERIVED = f"""CASE WHEN w.cancel_requested THEN 'CANCELLED'
         WHEN {HAS.format(w="w.id", st="'FAILED'")} THEN 'FAILED'
         WHEN {HAS.format(w="w.id", st="'CANCELLED'")} THEN 'CANCELLED'
         ELSE 'COMPLETED' END"""

FINISHED = f"""
CREATE OR REPLACE FUNCTION {{s}}.workflow_jobs_finished() RETURNS trigger LANGUAGE plpgsql
AS $fn$
DECLARE
    done uuid[];
    children uuid[];
    counts int[];
    released int;
    waiting uuid[];
    wfs uuid[];
    mode text;
BEGIN
    done := string_to_array(NULLIF(current_setting('{{s}}.wf_finished', true), ''), ',')::uuid[];
    IF done IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('{{s}}.wf_finished', '', true);
    -- the statements below on their generic plans (each planned once per session; the plans
    -- find every row by an index whatever the number of ids), not planned again at each call
    mode := current_setting('plan_cache_mode');
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    SELECT array_agg(x.job_id ORDER BY x.job_id), array_agg(x.n ORDER BY x.job_id)
    INTO children, counts
    FROM (SELECT d.job_id, count(*)::int AS n FROM {{s}}.job_dependencies d
          WHERE d.depends_on = ANY(done) GROUP BY d.job_id) x;
    IF children IS NOT NULL THEN
        -- several dependents are locked in id order first (two statements releasing never
        -- deadlock); a single one is locked by its update
        IF cardinality(children) > 1 THEN
            PERFORM 1 FROM {{s}}.jobs c WHERE c.id = ANY(children)
                AND CASE c.status WHEN 'WAITING' THEN true ELSE false END
            ORDER BY c.id FOR UPDATE;
        END IF;
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
            RETURNING c.id, c.job_type, c.priority, c.status, c.workflow_id
        ), ob AS (
            INSERT INTO {{s}}.job_outbox (job_id, job_type, priority)
            SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
        )
        SELECT count(*) FILTER (WHERE status = 'PENDING'), array_agg(DISTINCT workflow_id)
        INTO released, waiting FROM r;
        IF released > 0 THEN
            PERFORM pg_notify('{{s}}_outbox', '');
        END IF;
    END IF;
    -- the finished jobs' workflows (each job read by its primary key), less those with a
    -- dependent counted down just now: it is open, so they have not finished
    wfs := ARRAY(SELECT DISTINCT (SELECT j.workflow_id FROM {{s}}.jobs j WHERE j.id = x.id)
                 FROM unnest(done) AS x(id));
    IF NOT COALESCE(waiting @> wfs, false) THEN
        -- those with no open job (a probe each)
        wfs := ARRAY(SELECT v.id FROM unnest(wfs) AS v(id)
                     WHERE NOT v.id = ANY(COALESCE(waiting, ARRAY[]::uuid[]))
                       AND {HAS.format(w="v.id", st=OPEN)} IS NULL);
        IF cardinality(wfs) > 0 THEN
            -- finished with their status from their jobs; the open test again, in this snapshot
            UPDATE {{s}}.workflows w SET status = {DERIVED},
                finished_at = COALESCE(w.finished_at, now())
            WHERE w.id = ANY(wfs)
              AND {HAS.format(w="w.id", st=OPEN)} IS NULL
              AND w.status <> {DERIVED};
        END IF;
    END IF;
    PERFORM set_config('plan_cache_mode', mode, true);
    RETURN NULL;
END
$fn$
"""


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(FINISHED.format(s=schema))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(_beside("0020_workflow_release_by_id.py").FINISHED.format(s=schema))
