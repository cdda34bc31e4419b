"""workflows: jobs that wait for other jobs (``conveyor.workflows``, docs/workflows.md)

- ``job_status`` gains ``WAITING``: a job with unfinished dependencies. It has no outbox row,
  so no message, until its last dependency completes. PostgreSQL refuses a new enum value's use
  in the transaction that adds it (a view, an index predicate or a SQL function naming it), so
  the ``ALTER TYPE`` runs in an autocommit block of its own (``IF NOT EXISTS``: a re-run after a
  failure later in this revision finds it there).
- ``workflows``: one row per workflow; ``status`` RUNNING until every job is final, then
  COMPLETED, FAILED (a job failed), CANCELLED (``cancel_workflow``, or a job cancelled).
- ``jobs.workflow_id`` / ``workflow_key`` / ``deps_pending`` (the dependencies not yet
  satisfied) and ``job_dependencies(job_id, depends_on)``. No foreign keys: their per-row checks
  would cost every plain job's insert and delete a trigger call.
- Triggers on ``jobs`` status changes of workflow jobs only (``WHEN (NEW.workflow_id IS NOT
  NULL ...)``: a plain job pays the test of one column). Every path that changes a status, the
  worker's completions, cancels, lease recovery, redrive, operator SQL, goes through them:
  ``workflow_job_settled`` (AFTER) releases dependents whose counter reaches 0 (a decrement of
  the child's row: the row lock serialises concurrent parents, so exactly one transaction sees
  0 and releases), cancels them (``on_failure = 'cancel'``), brings cascade-cancelled dependents
  back to WAITING when a job is retried, and finishes the workflow when its last open job ends;
  ``workflow_job_redriven`` (BEFORE) keeps a redriven job WAITING while a dependency is unmet.
- ``retry_job`` leaves a WAITING job alone and publishes only what is released; ``cancel_job``
  cancels WAITING jobs; ``cancel_workflow(id)``; views ``running_workflows``,
  ``blocked_jobs``, ``workflow_counts``; ``backlog`` counts WAITING jobs.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = "'WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING'"
FINAL = "'COMPLETED', 'FAILED', 'CANCELLED'"

# The workflow's status from its jobs once none is open.
DERIVED = """CASE WHEN w.cancel_requested THEN 'CANCELLED'
         WHEN EXISTS (SELECT 1 FROM {s}.jobs x WHERE x.workflow_id = w.id
                      AND x.status = 'FAILED') THEN 'FAILED'
         WHEN EXISTS (SELECT 1 FROM {s}.jobs x WHERE x.workflow_id = w.id
                      AND x.status = 'CANCELLED') THEN 'CANCELLED'
         ELSE 'COMPLETED' END"""

# Every statement below finds jobs by id (``id = ANY(array)``, ``FROM unnest(...)``: the primary
# key), never by a join the planner may turn into a scan of ``jobs``: with a statement's few
# finished jobs and a ``WAITING`` estimate from the statistics it chose a sequential scan of
# the whole table, once per completion batch.

# The jobs downstream of a job, breadth first through ``job_dependencies`` (its index on
# ``depends_on``), in id order.
DOWNSTREAM = """
CREATE FUNCTION {s}.workflow_downstream(root uuid) RETURNS uuid[] LANGUAGE plpgsql AS $fn$
DECLARE
    found uuid[] := '{{}}';
    frontier uuid[] := ARRAY[root];
BEGIN
    LOOP
        frontier := ARRAY(SELECT DISTINCT d.job_id FROM {s}.job_dependencies d
                          WHERE d.depends_on = ANY(frontier) AND NOT d.job_id = ANY(found));
        EXIT WHEN cardinality(frontier) = 0;
        found := found || frontier;
    END LOOP;
    RETURN ARRAY(SELECT x FROM unnest(found) x ORDER BY x);
END
$fn$
"""

SETTLED = f"""
CREATE FUNCTION {{s}}.workflow_job_settled() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    policy text;
    stopped boolean;
    cause text;
    down uuid[];
    back uuid[];
    blocked uuid[];
BEGIN
    -- a job cancel_workflow's statement cancels: that statement cancels every open job of the
    -- workflow, so nothing downstream is left to cancel or count down (per job, that walk and
    -- the test for an open job took seconds for a 10,000-job workflow)
    IF current_setting('{{s}}.wf_cancelling', true) = NEW.workflow_id::text THEN
        RETURN NULL;
    END IF;
    IF NEW.status <> 'COMPLETED' THEN  -- a completion releases whatever the policy
        SELECT on_failure, cancel_requested INTO policy, stopped FROM {{s}}.workflows
        WHERE id = NEW.workflow_id;
    END IF;
    IF NEW.status IN ({FINAL}) AND OLD.status NOT IN ({FINAL}) THEN
        IF NEW.status = 'COMPLETED' OR policy = 'continue' THEN
            -- its dependents are counted down with those of the statement's other finished
            -- jobs, once, when the statement ends (workflow_jobs_finished)
            PERFORM set_config('{{s}}.wf_finished',
                COALESCE(NULLIF(current_setting('{{s}}.wf_finished', true), '') || ',', '')
                || NEW.id::text, true);
            RETURN NULL;
        END IF;
        -- every job downstream, still waiting, is cancelled naming this one
        cause := format('dependency %s (job %s) %s', COALESCE(NEW.workflow_key, '?'),
                        NEW.id, CASE NEW.status WHEN 'FAILED' THEN 'failed'
                                                ELSE 'was cancelled' END);
        down := {{s}}.workflow_downstream(NEW.id);
        PERFORM 1 FROM {{s}}.jobs c WHERE c.id = ANY(down) AND c.status = 'WAITING'
        ORDER BY c.id FOR UPDATE;
        UPDATE {{s}}.jobs c SET status = 'CANCELLED', last_error = cause,
            finished_at = now(), updated_at = now()
        WHERE c.id = ANY(down) AND c.status = 'WAITING';
        -- the last open job finishes the workflow (two last jobs ending at once each see the
        -- other open: the sweeper's workflow duty finishes that one)
        IF NOT EXISTS (SELECT 1 FROM {{s}}.jobs x WHERE x.workflow_id = NEW.workflow_id
                       AND x.status IN ({OPEN})) THEN
            UPDATE {{s}}.workflows w SET status = {DERIVED.format(s="{s}")},
                finished_at = COALESCE(w.finished_at, now())
            WHERE w.id = NEW.workflow_id AND w.status <> {DERIVED.format(s="{s}")};
        END IF;
    ELSIF OLD.status IN ({FINAL}) AND NEW.status NOT IN ({FINAL}) THEN
        -- A retry. The workflow row is read again under a lock: a cancel_workflow committed
        -- meanwhile is seen, one not started yet waits for this transaction (and cancels what
        -- it brings back).
        SELECT cancel_requested INTO stopped FROM {{s}}.workflows WHERE id = NEW.workflow_id
        FOR SHARE;
        IF policy = 'continue' THEN
            -- its failure counted its waiting dependents down: they count it again
            UPDATE {{s}}.jobs c SET deps_pending = c.deps_pending + 1
            WHERE c.id = ANY(ARRAY(SELECT d.job_id FROM {{s}}.job_dependencies d
                                   WHERE d.depends_on = NEW.id))
              AND c.status = 'WAITING';
        ELSIF NOT stopped THEN
            -- the jobs downstream that a failure cancelled (not those cancelled by someone:
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
            LOOP
                blocked := ARRAY(
                    SELECT DISTINCT d.job_id FROM {{s}}.job_dependencies d
                    JOIN {{s}}.jobs p ON p.id = d.depends_on
                    WHERE d.job_id = ANY(back) AND p.id <> NEW.id AND NOT p.id = ANY(back)
                      AND p.status IN ('FAILED', 'CANCELLED'));
                EXIT WHEN cardinality(blocked) = 0;
                back := ARRAY(SELECT x FROM unnest(back) x WHERE NOT x = ANY(blocked));
            END LOOP;
            UPDATE {{s}}.jobs c SET status = 'WAITING', last_error = NULL, finished_at = NULL,
                updated_at = now(),
                deps_pending = (SELECT count(*) FROM {{s}}.job_dependencies d
                                JOIN {{s}}.jobs p ON p.id = d.depends_on
                                WHERE d.job_id = c.id AND p.status <> 'COMPLETED')
            WHERE c.id = ANY(back);
        END IF;
        UPDATE {{s}}.workflows SET status = 'RUNNING', finished_at = NULL
        WHERE id = NEW.workflow_id AND status <> 'RUNNING' AND NOT cancel_requested;
    END IF;
    RETURN NULL;
END
$fn$
"""

# The statement's finished jobs (COMPLETED; under ``continue`` any final status), as the row
# trigger listed them in a transaction-local setting: their WAITING dependents locked in id order
# (two statements releasing never deadlock), then counted down by a new statement on the latest
# row versions, each by the number of its dependencies among them: the one that reaches 0
# releases it, with its outbox row and a NOTIFY at commit. One update of a fan-in's row per
# statement, not per parent. Then each of their workflows with no open job left finishes.
FINISHED = f"""
CREATE FUNCTION {{s}}.workflow_jobs_finished() RETURNS trigger LANGUAGE plpgsql AS $fn$
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
        PERFORM 1 FROM {{s}}.jobs c WHERE c.id = ANY(children) AND c.status = 'WAITING'
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
            WHERE c.id = k.id AND c.status = 'WAITING'
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
    WHERE w.id = ANY(ARRAY(SELECT DISTINCT j.workflow_id FROM {{s}}.jobs j
                           WHERE j.id = ANY(done)))
      AND NOT EXISTS (SELECT 1 FROM {{s}}.jobs x WHERE x.workflow_id = w.id
                      AND x.status IN ({OPEN}))
      AND w.status <> {DERIVED.format(s="{s}")};
    RETURN NULL;
END
$fn$
"""

# A redrive (retry_job, POST /jobs/{id}/retry, the DLQ tools) of a job whose dependencies are
# not all met (completed; under ``continue``, finished): while one of them is still open the job
# is WAITING again (the redriving statement writes an outbox row only for a PENDING job); while
# one failed or was cancelled (``cancel``) the redrive leaves the job as it is (a BEFORE trigger
# returning NULL skips the row): it comes back when that dependency is retried.
REDRIVEN = f"""
CREATE FUNCTION {{s}}.workflow_job_redriven() RETURNS trigger LANGUAGE plpgsql AS $fn$
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
        NEW.deps_pending := unmet;
    END IF;
    RETURN NEW;
END
$fn$
"""

RETRY_JOB = """
CREATE OR REPLACE FUNCTION {s}.retry_job(job_id uuid) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    j {s}.jobs%ROWTYPE;
    new_status text;
BEGIN
    SELECT * INTO j FROM {s}.jobs WHERE id = job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF j.status = 'IN_PROGRESS' THEN
        RAISE EXCEPTION 'job % is IN_PROGRESS: a re-run now would throw away the running '
            'attempt''s result; cancel it with {s}.cancel_job(), or let it finish', job_id;
    ELSIF j.status = 'COMPLETED' THEN
        RAISE EXCEPTION 'job % is COMPLETED: a re-run would replace its result; submit a new '
            'job instead', job_id;
    ELSIF j.status = 'WAITING' THEN
        RETURN 'WAITING';  -- released when its dependencies complete
    END IF;
    new_status := CASE WHEN j.status = 'CANCELLED' AND j.attempts = 0 AND j.run_at > now()
                       THEN 'SCHEDULED' WHEN j.status = 'RETRYING' THEN 'RETRYING'
                       ELSE 'PENDING' END;
    UPDATE {s}.jobs SET
        status = new_status::{s}.job_status,
        run_at = CASE WHEN new_status = 'SCHEDULED' THEN run_at
                      WHEN j.status IN ('FAILED', 'CANCELLED') THEN NULL
                      WHEN run_at > now() THEN now() ELSE run_at END,
        retry_count = CASE WHEN j.status IN ('FAILED', 'CANCELLED') THEN 0 ELSE retry_count END,
        cancel_requested = false,
        result = NULL, finished_at = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE id = job_id
    RETURNING status::text INTO new_status;
    IF new_status IS NULL THEN
        RETURN j.status;  -- a workflow job whose dependency failed: kept until that is retried
    END IF;
    IF new_status NOT IN ('SCHEDULED', 'WAITING') AND NOT EXISTS (
        SELECT 1 FROM {s}.job_outbox o WHERE o.job_id = j.id AND o.destination = 'work'
    ) THEN
        INSERT INTO {s}.job_outbox (job_id, job_type, priority)
        VALUES (j.id, j.job_type, j.priority);
        PERFORM pg_notify('{s}_outbox', '');
    END IF;
    RETURN new_status;
END
$fn$
"""

CANCEL_JOB = """
CREATE OR REPLACE FUNCTION {s}.cancel_job(job_id uuid) RETURNS text LANGUAGE sql AS $fn$
UPDATE {s}.jobs SET
    status = (CASE WHEN status = 'IN_PROGRESS' THEN 'IN_PROGRESS' ELSE 'CANCELLED' END)
             ::{s}.job_status,
    cancel_requested = true,
    finished_at = CASE WHEN status = 'IN_PROGRESS' THEN NULL ELSE now() END,
    lease_expires_at = CASE WHEN status = 'IN_PROGRESS' THEN lease_expires_at END,
    run_at = CASE WHEN status IN ('SCHEDULED', 'IN_PROGRESS', 'WAITING') THEN run_at END,
    updated_at = now()
WHERE id = job_id AND status IN ('WAITING', 'PENDING', 'SCHEDULED', 'RETRYING', 'IN_PROGRESS')
RETURNING status::text
$fn$
"""

# Cancels every open job of the workflow (a running one is asked to stop), its jobs locked in id
# order first; nothing is released after it (a release needs a WAITING job), and no retry brings
# a dependent back. The number of jobs it cancelled or asked to stop; NULL for no such workflow.
CANCEL_WORKFLOW = f"""
CREATE FUNCTION {{s}}.cancel_workflow(wf uuid) RETURNS integer LANGUAGE plpgsql AS $fn$
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
    PERFORM set_config('{{s}}.wf_cancelling', wf::text, true);
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
    PERFORM set_config('{{s}}.wf_cancelling', '', true);
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

COUNTS = """
SELECT w.id AS workflow_id, w.name, w.status, w.on_failure, w.created_at, w.finished_at,
       now() - w.created_at AS age, c.*
FROM {s}.workflows w CROSS JOIN LATERAL (
    SELECT count(*) AS jobs,
           count(*) FILTER (WHERE j.status = 'WAITING') AS waiting,
           count(*) FILTER (WHERE j.status IN ('PENDING', 'SCHEDULED', 'RETRYING')) AS queued,
           count(*) FILTER (WHERE j.status = 'IN_PROGRESS') AS running,
           count(*) FILTER (WHERE j.status = 'COMPLETED') AS completed,
           count(*) FILTER (WHERE j.status = 'FAILED') AS failed,
           count(*) FILTER (WHERE j.status = 'CANCELLED') AS cancelled
    FROM {s}.jobs j WHERE j.workflow_id = w.id) c
"""

VIEWS = {
    "workflow_counts": COUNTS,
    "running_workflows": COUNTS + "WHERE w.status = 'RUNNING'",
    "blocked_jobs": """
SELECT j.id, j.workflow_id, w.name AS workflow, j.workflow_key AS key, j.job_type AS type,
       j.deps_pending, j.created_at,
       array_agg(p.workflow_key || ' (' || p.status || ')' ORDER BY p.workflow_key)
           FILTER (WHERE p.status <> 'COMPLETED') AS waiting_for
FROM {s}.jobs j
JOIN {s}.workflows w ON w.id = j.workflow_id
JOIN {s}.job_dependencies d ON d.job_id = j.id
JOIN {s}.jobs p ON p.id = d.depends_on
WHERE j.workflow_id IS NOT NULL AND j.status = 'WAITING'
GROUP BY j.id, w.name
""",
}

BACKLOG = """
WITH RECURSIVE t(job_type) AS (
    SELECT min(job_type) FROM {s}.jobs
    UNION ALL
    SELECT (SELECT min(j.job_type) FROM {s}.jobs j WHERE j.job_type > t.job_type)
    FROM t WHERE t.job_type IS NOT NULL
)
SELECT t.job_type AS type, st.status, c.count, o.oldest
FROM t
CROSS JOIN unnest(ARRAY[{statuses}]::{s}.job_status[]) AS st(status)
CROSS JOIN LATERAL (SELECT count(*) AS count FROM {s}.jobs j
                    WHERE j.job_type = t.job_type AND j.status = st.status) c
CROSS JOIN LATERAL (SELECT j.created_at AS oldest FROM {s}.jobs j
                    WHERE j.job_type = t.job_type AND j.status = st.status
                    ORDER BY j.id LIMIT 1) o
WHERE t.job_type IS NOT NULL
"""
COUNTED = "'SCHEDULED', 'PENDING', 'RETRYING', 'IN_PROGRESS', 'FAILED'"


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    assert schema is not None
    with op.get_context().autocommit_block():
        op.execute(
            f"ALTER TYPE {schema}.job_status ADD VALUE IF NOT EXISTS 'WAITING' BEFORE 'PENDING'"
        )
    op.execute(f"SET LOCAL search_path TO {schema}")
    now = sa.func.now()
    op.create_table(
        "workflows",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False, server_default="RUNNING"),
        sa.Column("on_failure", sa.Text(), nullable=False, server_default="cancel"),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED')",
            name="workflows_status_check",
        ),
        sa.CheckConstraint(
            "on_failure IN ('cancel', 'continue')", name="workflows_on_failure_check"
        ),
        schema=schema,
    )
    op.create_index(
        "workflows_running_idx",
        "workflows",
        ["created_at"],
        schema=schema,
        postgresql_where=sa.text("status = 'RUNNING'"),
    )
    op.create_index(
        "workflows_finished_idx",
        "workflows",
        ["finished_at"],
        schema=schema,
        postgresql_where=sa.text("status <> 'RUNNING'"),
    )
    op.create_table(
        "job_dependencies",
        sa.Column("job_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("depends_on", pg.UUID(as_uuid=True), primary_key=True),
        schema=schema,
    )
    op.create_index(
        "job_dependencies_depends_on_idx", "job_dependencies", ["depends_on"], schema=schema
    )
    op.add_column("jobs", sa.Column("workflow_id", pg.UUID(as_uuid=True)), schema=schema)
    op.add_column("jobs", sa.Column("workflow_key", sa.Text()), schema=schema)
    op.add_column("jobs", sa.Column("deps_pending", sa.Integer()), schema=schema)
    op.create_index(
        "jobs_workflow_idx",
        "jobs",
        ["workflow_id", "status"],
        schema=schema,
        postgresql_where=sa.text("workflow_id IS NOT NULL"),
    )
    op.execute(DOWNSTREAM.format(s=schema))
    op.execute(SETTLED.format(s=schema))
    op.execute(REDRIVEN.format(s=schema))
    op.execute(FINISHED.format(s=schema))
    # only a change into or out of a final status: a release or a claim costs no call
    op.execute(f"""
        CREATE TRIGGER jobs_workflow_settled AFTER UPDATE OF status ON {schema}.jobs
        FOR EACH ROW WHEN (NEW.workflow_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
            AND (NEW.status IN ({FINAL}) OR OLD.status IN ({FINAL})))
        EXECUTE FUNCTION {schema}.workflow_job_settled()""")
    # once per statement that sets a status: a function call that returns at once unless the
    # statement finished workflow jobs
    op.execute(f"""
        CREATE TRIGGER jobs_workflow_finished AFTER UPDATE OF status ON {schema}.jobs
        FOR EACH STATEMENT EXECUTE FUNCTION {schema}.workflow_jobs_finished()""")
    op.execute(f"""
        CREATE TRIGGER jobs_workflow_redriven BEFORE UPDATE OF status ON {schema}.jobs
        FOR EACH ROW WHEN (NEW.workflow_id IS NOT NULL
            AND OLD.status IN ('FAILED', 'CANCELLED')
            AND NEW.status IN ('PENDING', 'SCHEDULED', 'RETRYING'))
        EXECUTE FUNCTION {schema}.workflow_job_redriven()""")
    op.execute(RETRY_JOB.format(s=schema))
    op.execute(CANCEL_JOB.format(s=schema))
    op.execute(CANCEL_WORKFLOW.format(s=schema))
    for name, body in VIEWS.items():
        op.execute(f"CREATE VIEW {schema}.{name} AS {body.format(s=schema)}")
    statuses = f"'WAITING', {COUNTED}"
    op.execute(
        f"CREATE OR REPLACE VIEW {schema}.backlog AS " + BACKLOG.format(s=schema, statuses=statuses)
    )


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(
        f"CREATE OR REPLACE VIEW {schema}.backlog AS " + BACKLOG.format(s=schema, statuses=COUNTED)
    )
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {schema}.{name}")
    op.execute(f"DROP FUNCTION IF EXISTS {schema}.cancel_workflow(uuid)")
    op.execute(f"DROP TRIGGER IF EXISTS jobs_workflow_redriven ON {schema}.jobs")
    op.execute(f"DROP TRIGGER IF EXISTS jobs_workflow_finished ON {schema}.jobs")
    op.execute(f"DROP TRIGGER IF EXISTS jobs_workflow_settled ON {schema}.jobs")
    op.execute(f"DROP FUNCTION IF EXISTS {schema}.workflow_jobs_finished()")
    op.execute(f"DROP FUNCTION IF EXISTS {schema}.workflow_downstream(uuid)")
    op.execute(f"DROP FUNCTION IF EXISTS {schema}.workflow_job_redriven()")
    op.execute(f"DROP FUNCTION IF EXISTS {schema}.workflow_job_settled()")
    op.drop_index("jobs_workflow_idx", "jobs", schema=schema)
    for column in ("deps_pending", "workflow_key", "workflow_id"):
        op.drop_column("jobs", column, schema=schema)
    op.drop_table("job_dependencies", schema=schema)
    op.drop_table("workflows", schema=schema)
    # WAITING stays in job_status (PostgreSQL cannot drop an enum value); the operator
    # functions of 0013 come back as they were
    op.execute(
        f"UPDATE {schema}.jobs SET status = 'CANCELLED', finished_at = now() "
        "WHERE status = 'WAITING'"
    )
