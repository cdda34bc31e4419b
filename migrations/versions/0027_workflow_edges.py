"""Every edge of a workflow holds: reopened jobs count their dependents back up, a reopened job
reopens its workflow, and cascades run in time linear in the jobs they touch

- ``workflow_job_settled`` is rewritten whole:
  - A job that leaves COMPLETED for an open status (an operator's hand re-run; under
    ``continue`` also FAILED or CANCELLED, a redrive) counted its dependents down when it
    finished: they count it again. A dependent it released that no worker has claimed yet
    (PENDING, SCHEDULED, RETRYING) waits again, its outbox row taken back; a message already
    sent finds it WAITING and is dropped. Before, only ``continue``'s WAITING dependents were
    counted up, so a fan-in was released once its other parents' count reached 0 while the
    re-run parent still ran.
  - A reopened job reopens its workflow: ``finished_at`` back to NULL (retention deletes only a
    finished workflow, by ``finished_at``), and RUNNING unless the workflow was cancelled (then
    it stays CANCELLED, and finishes again when its last open job ends). Before, a redrive of a
    cancelled workflow's job left it finished, and retention deleted the job while it ran.
  - A cascade (a failure or cancel cancelling what waits downstream; a redrive bringing back what
    the failure cancelled) changes every job it touches in one statement, under the setting
    ``wf_quiet``, which tells the trigger on each of those rows that the graph's work is done.
    Before, each cancelled row's trigger walked the downstream graph again: a 1,000-deep chain's
    failure took 75 s. The jobs that a redrive leaves cancelled (another dependency of theirs
    failed) are found by one recursive walk from those dependencies, not by removing one level
    per pass.
- ``workflow_downstream`` is one recursive query (each job once, through the index on
  ``depends_on``), not a loop that tested each new job against every job found so far. Its
  steps, and those of the cascade's own walk, join by nested loop: a merge join read every
  edge of the table once per step (a 10,000-deep chain: 8.7 s; 0.5 s by index).
- ``cancel_workflow`` marks its statement with the same ``wf_quiet``.
- ``jobs_workflow_redriven`` (a reopened job waits while a dependency is unmet) covers a job
  leaving COMPLETED too (a hand re-run of a job whose own dependency was re-run waits for it),
  and sets ``deps_pending`` whether or not the job waits: a job cancelled while it waited kept
  its count, and a redrive that let it run left the count behind for the next count-up.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-02
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = "'WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING'"
FINAL = "'COMPLETED', 'FAILED', 'CANCELLED'"

DOWNSTREAM = """
CREATE OR REPLACE FUNCTION {s}.workflow_downstream(root uuid) RETURNS uuid[] LANGUAGE sql
-- each step looks up the edges of the jobs the last step found, by index: a merge or hash join
-- would read every edge of the table once per step (a 10,000-deep chain: 17 s)
SET enable_mergejoin = off SET enable_hashjoin = off SET enable_seqscan = off AS $fn$
WITH RECURSIVE down(id) AS (
    SELECT d.job_id FROM {s}.job_dependencies d WHERE d.depends_on = root
    UNION
    SELECT d.job_id FROM down JOIN {s}.job_dependencies d ON d.depends_on = down.id
)
SELECT COALESCE(array_agg(id ORDER BY id), '{{}}') FROM down
$fn$
"""

# The workflow's status from its jobs once none is open.
DERIVED = """CASE WHEN w.cancel_requested THEN 'CANCELLED'
         WHEN EXISTS (SELECT 1 FROM {s}.jobs x WHERE x.workflow_id = w.id
                      AND x.status = 'FAILED') THEN 'FAILED'
         WHEN EXISTS (SELECT 1 FROM {s}.jobs x WHERE x.workflow_id = w.id
                      AND x.status = 'CANCELLED') THEN 'CANCELLED'
         ELSE 'COMPLETED' END"""

SETTLED = f"""
CREATE OR REPLACE FUNCTION {{s}}.workflow_job_settled() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    policy text;
    stopped boolean;
    cause text;
    down uuid[];
    back uuid[];
    seqscan text;
    mergejoin text;
    hashjoin text;
BEGIN
    -- a job changed by a statement that does its workflow's graph work itself: cancel_workflow,
    -- or a cascade below (which handles everything downstream of its job at once)
    IF current_setting('{{s}}.wf_quiet', true) = NEW.workflow_id::text THEN
        RETURN NULL;
    END IF;
    -- a completion counts its dependents down whatever the policy
    IF NEW.status <> 'COMPLETED' THEN
        SELECT on_failure INTO policy FROM {{s}}.workflows WHERE id = NEW.workflow_id;
    END IF;
    IF NEW.status IN ({FINAL}) AND OLD.status NOT IN ({FINAL})
       AND (NEW.status = 'COMPLETED' OR policy = 'continue') THEN
        -- its dependents are counted down with those of the statement's other finished jobs,
        -- once, when the statement ends (workflow_jobs_finished)
        PERFORM set_config('{{s}}.wf_finished',
            COALESCE(NULLIF(current_setting('{{s}}.wf_finished', true), '') || ',', '')
            || NEW.id::text, true);
        RETURN NULL;
    END IF;
    -- a cascade: the statements below read jobs and edges by index, whatever the statistics
    -- were when the session planned them, and a recursive step looks up only the edges of the
    -- jobs the last step found (a merge or hash join reads every edge once per step)
    seqscan := current_setting('enable_seqscan');
    mergejoin := current_setting('enable_mergejoin');
    hashjoin := current_setting('enable_hashjoin');
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('enable_mergejoin', 'off', true);
    PERFORM set_config('enable_hashjoin', 'off', true);
    IF NEW.status IN ({FINAL}) AND OLD.status NOT IN ({FINAL}) THEN
        -- every job downstream, still waiting, is cancelled naming this one, in one statement
        cause := format('dependency %s (job %s) %s', COALESCE(NEW.workflow_key, '?'),
                        NEW.id, CASE NEW.status WHEN 'FAILED' THEN 'failed'
                                                ELSE 'was cancelled' END);
        down := {{s}}.workflow_downstream(NEW.id);
        PERFORM 1 FROM {{s}}.jobs c WHERE c.id = ANY(down) AND c.status = 'WAITING'
        ORDER BY c.id FOR UPDATE;
        PERFORM set_config('{{s}}.wf_quiet', NEW.workflow_id::text, true);
        UPDATE {{s}}.jobs c SET status = 'CANCELLED', last_error = cause,
            finished_at = now(), updated_at = now()
        WHERE c.id = ANY(down) AND c.status = 'WAITING';
        PERFORM set_config('{{s}}.wf_quiet', '', true);
        -- the last open job finishes the workflow (two last jobs ending at once each see the
        -- other open: the sweeper's workflow duty finishes that one)
        IF NOT EXISTS (SELECT 1 FROM {{s}}.jobs x WHERE x.workflow_id = NEW.workflow_id
                       AND x.status IN ({OPEN})) THEN
            UPDATE {{s}}.workflows w SET status = {DERIVED.format(s="{s}")},
                finished_at = COALESCE(w.finished_at, now())
            WHERE w.id = NEW.workflow_id AND w.status <> {DERIVED.format(s="{s}")};
        END IF;
    ELSIF OLD.status IN ({FINAL}) AND NEW.status NOT IN ({FINAL}) THEN
        -- Reopened: a redrive, or an operator's hand re-run. The workflow row is read again
        -- under a lock: a cancel_workflow committed meanwhile is seen, one not started yet waits
        -- for this transaction (and cancels what it brings back).
        SELECT cancel_requested INTO stopped FROM {{s}}.workflows WHERE id = NEW.workflow_id
        FOR SHARE;
        IF OLD.status = 'COMPLETED' OR policy = 'continue' THEN
            -- its end counted its dependents down: they count it again. One it released that no
            -- worker has claimed yet waits again, its outbox row taken back (a message already
            -- sent finds it WAITING and is dropped); one claimed already ran or runs on.
            back := ARRAY(SELECT d.job_id FROM {{s}}.job_dependencies d
                          WHERE d.depends_on = NEW.id ORDER BY d.job_id);
            WITH up AS (
                UPDATE {{s}}.jobs c SET deps_pending = c.deps_pending + 1, status = 'WAITING',
                    updated_at = now()
                WHERE c.id = ANY(back)
                  AND c.status IN ('WAITING', 'PENDING', 'SCHEDULED', 'RETRYING')
                RETURNING c.id
            )
            DELETE FROM {{s}}.job_outbox o
            WHERE o.job_id = ANY(ARRAY(SELECT id FROM up)) AND o.destination = 'work';
        ELSIF NOT stopped THEN
            -- The jobs downstream that a failure cancelled (not those cancelled by someone:
            -- cancel_requested) wait again, each counting its dependencies not completed; but
            -- not one with another failed or cancelled dependency (nor, then, its dependents):
            -- it comes back when that one is retried. Their dependencies are locked first: one
            -- completing at this moment is counted completed (its own trigger, looking for
            -- WAITING dependents, cannot see these become WAITING).
            down := {{s}}.workflow_downstream(NEW.id);
            back := ARRAY(SELECT c.id FROM {{s}}.jobs c WHERE c.id = ANY(down)
                          AND c.status = 'CANCELLED' AND NOT c.cancel_requested ORDER BY c.id);
            PERFORM 1 FROM {{s}}.jobs p
            WHERE p.id = ANY(ARRAY(SELECT d.depends_on FROM {{s}}.job_dependencies d
                                   WHERE d.job_id = ANY(back)))
            ORDER BY p.id FOR SHARE;
            PERFORM set_config('{{s}}.wf_quiet', NEW.workflow_id::text, true);
            UPDATE {{s}}.jobs c SET status = 'WAITING', finished_at = NULL, updated_at = now(),
                deps_pending = (SELECT count(*) FROM {{s}}.job_dependencies d
                                JOIN {{s}}.jobs p ON p.id = d.depends_on
                                WHERE d.job_id = c.id AND p.status <> 'COMPLETED')
            WHERE c.id = ANY(back);
            -- now every job still FAILED or CANCELLED stays so: what waits downstream of one,
            -- through the jobs just brought back, is cancelled again (its cause kept)
            WITH RECURSIVE stay(id) AS (
                SELECT d.job_id FROM {{s}}.job_dependencies d
                JOIN {{s}}.jobs p ON p.id = d.depends_on
                WHERE d.job_id = ANY(back) AND p.status IN ('FAILED', 'CANCELLED')
                UNION
                SELECT d.job_id FROM stay
                JOIN {{s}}.job_dependencies d ON d.depends_on = stay.id
                JOIN {{s}}.jobs c ON c.id = d.job_id
                WHERE c.status = 'WAITING'
            )
            UPDATE {{s}}.jobs c SET status = 'CANCELLED', finished_at = now()
            WHERE c.id = ANY(ARRAY(SELECT id FROM stay)) AND c.status = 'WAITING';
            UPDATE {{s}}.jobs c SET last_error = NULL
            WHERE c.id = ANY(back) AND c.status = 'WAITING';
            PERFORM set_config('{{s}}.wf_quiet', '', true);
        END IF;
        -- the workflow is open again: not finished (retention goes by finished_at), and
        -- RUNNING unless it was cancelled
        UPDATE {{s}}.workflows SET finished_at = NULL,
            status = CASE WHEN cancel_requested THEN status ELSE 'RUNNING' END
        WHERE id = NEW.workflow_id
          AND (finished_at IS NOT NULL OR (status <> 'RUNNING' AND NOT cancel_requested));
    END IF;
    PERFORM set_config('enable_seqscan', seqscan, true);
    PERFORM set_config('enable_mergejoin', mergejoin, true);
    PERFORM set_config('enable_hashjoin', hashjoin, true);
    RETURN NULL;
END
$fn$
"""

CANCEL_WORKFLOW = f"""
CREATE OR REPLACE FUNCTION {{s}}.cancel_workflow(wf uuid) RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
    n int;
    tries int := 0;
BEGIN
    -- A completion locks its job, then the dependents it releases, and a retry its job, then
    -- the workflow row: against those orders a deadlock is possible. When this block is the
    -- victim it lets go of everything it locked, the workflow row included (a retry waiting
    -- for that row would otherwise never see the cycle again), and tries again; the worker's
    -- completer retries its batch when it is the victim.
    LOOP
    BEGIN
    -- a COMPLETED workflow stays so; a FAILED one is CANCELLED, and no retry revives it
    UPDATE {{s}}.workflows SET cancel_requested = status <> 'COMPLETED',
        status = CASE WHEN status = 'COMPLETED' THEN status ELSE 'CANCELLED' END
    WHERE id = wf;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM {{s}}.jobs WHERE workflow_id = wf AND status IN ({OPEN})
    ORDER BY id FOR UPDATE;
    -- every open job of the workflow changes here: nothing downstream is left for each job's
    -- trigger to cancel or count down
    PERFORM set_config('{{s}}.wf_quiet', wf::text, true);
    UPDATE {{s}}.jobs SET
        status = (CASE WHEN status = 'IN_PROGRESS' THEN 'IN_PROGRESS' ELSE 'CANCELLED' END)
                 ::{{s}}.job_status,
        cancel_requested = true,
        last_error = CASE WHEN status = 'IN_PROGRESS' THEN last_error
                          ELSE 'workflow cancelled' END,
        finished_at = CASE WHEN status = 'IN_PROGRESS' THEN NULL ELSE now() END,
        lease_expires_at = CASE WHEN status = 'IN_PROGRESS' THEN lease_expires_at END,
        updated_at = now()
    WHERE workflow_id = wf AND status IN ({OPEN})
      AND NOT (status = 'IN_PROGRESS' AND cancel_requested);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('{{s}}.wf_quiet', '', true);
    RETURN n;
    EXCEPTION WHEN deadlock_detected THEN
        tries := tries + 1;
        IF tries >= 10 THEN
            RAISE;
        END IF;
        PERFORM pg_sleep(random() / 20);
    END;
    END LOOP;
END
$fn$
"""

REDRIVEN = f"""
CREATE OR REPLACE FUNCTION {{s}}.workflow_job_redriven() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    unmet int;
    dead int;
BEGIN
    -- the dependencies locked first, then counted by a new statement: one finishing at this
    -- moment is counted finished (its own trigger, looking for WAITING dependents, cannot see
    -- this row become WAITING)
    PERFORM 1 FROM {{s}}.jobs p
    WHERE p.id = ANY(ARRAY(SELECT depends_on FROM {{s}}.job_dependencies WHERE job_id = NEW.id))
    ORDER BY p.id FOR SHARE;
    SELECT count(*) FILTER (WHERE p.status NOT IN ({FINAL})),
           count(*) FILTER (WHERE w.on_failure = 'cancel' AND p.status IN ('FAILED', 'CANCELLED'))
    INTO unmet, dead
    FROM {{s}}.job_dependencies d
    JOIN {{s}}.jobs p ON p.id = d.depends_on
    JOIN {{s}}.workflows w ON w.id = NEW.workflow_id
    WHERE d.job_id = NEW.id;
    IF dead > 0 THEN
        RETURN NULL;
    ELSIF unmet > 0 THEN
        NEW.status := 'WAITING';
    END IF;
    -- exact whatever it was: a job cancelled while it waited kept its count
    NEW.deps_pending := unmet;
    RETURN NEW;
END
$fn$
"""

REDRIVEN_TRIGGER = """
CREATE OR REPLACE TRIGGER jobs_workflow_redriven BEFORE UPDATE OF status ON {s}.jobs FOR EACH ROW
WHEN (NEW.workflow_id IS NOT NULL AND OLD.status IN ({final})
      AND NEW.status IN ('PENDING', 'SCHEDULED', 'RETRYING'))
EXECUTE FUNCTION {s}.workflow_job_redriven();
"""


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(DOWNSTREAM.format(s=schema))
    op.execute(SETTLED.format(s=schema))
    op.execute(CANCEL_WORKFLOW.format(s=schema))
    op.execute(REDRIVEN.format(s=schema))
    op.execute(REDRIVEN_TRIGGER.format(s=schema, final=FINAL))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    spec = importlib.util.spec_from_file_location(
        "_0016", Path(__file__).with_name("0016_workflows.py")
    )
    assert spec is not None and spec.loader is not None
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    for text in (before.DOWNSTREAM, before.SETTLED, before.CANCEL_WORKFLOW, before.REDRIVEN):
        op.execute(
            text.format(s=schema).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        )
    op.execute(REDRIVEN_TRIGGER.format(s=schema, final="'FAILED', 'CANCELLED'"))
