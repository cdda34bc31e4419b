-- Workflows: jobs that wait for other jobs. The release, the failure policy and the workflow's
-- status are kept by the triggers below, on every path that changes a workflow job's status
-- (a worker's outcome, a cancel, lease recovery, a redrive, an operator's hand edit).
--
-- The rule: a job's deps_pending counts its dependencies not completed. A job that completes
-- counts its dependents down (all of a statement's finished jobs at once, when the statement
-- ends); one reaching 0 is released (PENDING with its outbox row, or SCHEDULED). A job that
-- fails or is cancelled cancels every job waiting downstream (on_failure 'cancel') or counts
-- them down as a completion would ('continue'). A job that leaves its end (a redrive, a hand
-- re-run) takes that back: its dependents count it again, and those its failure cancelled wait
-- again. The last job to end finishes its workflow; a job reopened reopens it.

CREATE TABLE __schema__.workflows (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    status text NOT NULL DEFAULT 'RUNNING' CONSTRAINT workflows_status_check
        CHECK (status IN ('RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    on_failure text NOT NULL DEFAULT 'cancel'
        CONSTRAINT workflows_on_failure_check CHECK (on_failure IN ('cancel', 'continue')),
    -- cancel_workflow(): CANCELLED whatever its jobs did, and never running again
    cancel_requested boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,  -- retention deletes a workflow by it; NULL while it runs
    -- POST /workflows' Idempotency-Key and the request it was used with
    idempotency_key text,
    request_hash text
);
-- the finishing duty's backstop reads the running ones; retention the finished, oldest first
CREATE INDEX workflows_running_idx ON __schema__.workflows (created_at) WHERE status = 'RUNNING';
CREATE INDEX workflows_finished_idx ON __schema__.workflows (finished_at)
    WHERE status <> 'RUNNING';
-- GET /workflows filtered by status or by name, newest first
CREATE INDEX workflows_status_id_idx ON __schema__.workflows (status, id);
CREATE INDEX workflows_name_id_idx ON __schema__.workflows (name, id);
CREATE UNIQUE INDEX workflows_idempotency_key_idx ON __schema__.workflows (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- One row per edge: job_id waits for depends_on.
CREATE TABLE __schema__.job_dependencies (
    job_id uuid,
    depends_on uuid,
    PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX job_dependencies_depends_on_idx ON __schema__.job_dependencies (depends_on);

-- A finished workflow's status from its jobs. Each test is one probe of jobs_workflow_idx: a
-- scalar subquery runs per row, where an EXISTS may become a hashed subplan reading every job
-- of that status in the table.
CREATE FUNCTION __schema__.workflow_outcome(wf uuid, cancelled boolean) RETURNS text
LANGUAGE sql STABLE AS $fn$
SELECT CASE
    WHEN cancelled THEN 'CANCELLED'
    WHEN (SELECT true FROM __schema__.jobs x WHERE x.workflow_id = wf AND x.status = 'FAILED'
          LIMIT 1) THEN 'FAILED'
    WHEN (SELECT true FROM __schema__.jobs x WHERE x.workflow_id = wf AND x.status = 'CANCELLED'
          LIMIT 1) THEN 'CANCELLED'
    ELSE 'COMPLETED'
END
$fn$;

-- Every job downstream of ``root``, each once. Each step looks up the edges of the jobs the
-- last step found, by index: a merge or hash join would read every edge of the table once per
-- step (a 10,000-deep chain: 8.7 s instead of 0.5 s).
CREATE FUNCTION __schema__.workflow_downstream(root uuid) RETURNS uuid[]
LANGUAGE sql
SET enable_mergejoin = off SET enable_hashjoin = off SET enable_seqscan = off
AS $fn$
WITH RECURSIVE down(id) AS (
    SELECT d.job_id FROM __schema__.job_dependencies d WHERE d.depends_on = root
    UNION
    SELECT d.job_id FROM down JOIN __schema__.job_dependencies d ON d.depends_on = down.id
)
SELECT COALESCE(array_agg(id ORDER BY id), '{}') FROM down
$fn$;

-- After each change of a workflow job's status: a job that ended is listed for the statement's
-- end (a completion, or any end under 'continue'), or cancels what waits downstream; a job that
-- left its end takes back what its end did.
CREATE FUNCTION __schema__.workflow_job_settled() RETURNS trigger LANGUAGE plpgsql AS $fn$
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
    IF current_setting('__schema__.wf_quiet', true) = NEW.workflow_id::text THEN
        RETURN NULL;
    END IF;
    -- a completion counts its dependents down whatever the policy
    IF NEW.status <> 'COMPLETED' THEN
        SELECT on_failure INTO policy FROM __schema__.workflows WHERE id = NEW.workflow_id;
    END IF;
    IF NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND (NEW.status = 'COMPLETED' OR policy = 'continue') THEN
        -- its dependents are counted down with those of the statement's other finished jobs,
        -- once, when the statement ends (workflow_jobs_finished)
        PERFORM set_config('__schema__.wf_finished',
            COALESCE(NULLIF(current_setting('__schema__.wf_finished', true), '') || ',', '')
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
    IF NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
        -- every job downstream, still waiting, is cancelled naming this one, in one statement
        cause := format('dependency %s (job %s) %s', COALESCE(NEW.workflow_key, '?'),
                        NEW.id, CASE NEW.status WHEN 'FAILED' THEN 'failed'
                                                ELSE 'was cancelled' END);
        down := __schema__.workflow_downstream(NEW.id);
        PERFORM 1 FROM __schema__.jobs c WHERE c.id = ANY(down) AND c.status = 'WAITING'
        ORDER BY c.id FOR UPDATE;
        PERFORM set_config('__schema__.wf_quiet', NEW.workflow_id::text, true);
        UPDATE __schema__.jobs c SET status = 'CANCELLED', last_error = cause,
            finished_at = now(), updated_at = now()
        WHERE c.id = ANY(down) AND c.status = 'WAITING';
        PERFORM set_config('__schema__.wf_quiet', '', true);
        -- the last open job finishes the workflow (two last jobs ending at once each see the
        -- other open: the sweeper's workflow duty finishes that one)
        IF NOT EXISTS (SELECT 1 FROM __schema__.jobs x WHERE x.workflow_id = NEW.workflow_id
                       AND x.status IN ('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS',
                                        'RETRYING')) THEN
            UPDATE __schema__.workflows w
            SET status = __schema__.workflow_outcome(w.id, w.cancel_requested),
                finished_at = COALESCE(w.finished_at, now())
            WHERE w.id = NEW.workflow_id
              AND w.status <> __schema__.workflow_outcome(w.id, w.cancel_requested);
        END IF;
    ELSIF OLD.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND NEW.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
        -- Reopened: a redrive, or an operator's hand re-run. The workflow row is read again
        -- under a lock: a cancel_workflow committed meanwhile is seen, one not started yet waits
        -- for this transaction (and cancels what it brings back).
        SELECT cancel_requested INTO stopped FROM __schema__.workflows WHERE id = NEW.workflow_id
        FOR SHARE;
        IF OLD.status = 'COMPLETED' OR policy = 'continue' THEN
            -- its end counted its dependents down: they count it again. One it released that no
            -- worker has claimed yet waits again, its outbox row taken back (a message already
            -- sent finds it WAITING and is dropped); one claimed already ran or runs on.
            back := ARRAY(SELECT d.job_id FROM __schema__.job_dependencies d
                          WHERE d.depends_on = NEW.id ORDER BY d.job_id);
            WITH up AS (
                UPDATE __schema__.jobs c SET deps_pending = c.deps_pending + 1,
                    status = 'WAITING', updated_at = now()
                WHERE c.id = ANY(back)
                  AND c.status IN ('WAITING', 'PENDING', 'SCHEDULED', 'RETRYING')
                RETURNING c.id
            )
            DELETE FROM __schema__.job_outbox o
            WHERE o.job_id = ANY(ARRAY(SELECT id FROM up)) AND o.destination = 'work';
        ELSIF NOT stopped THEN
            -- The jobs downstream that a failure cancelled (not those cancelled by someone:
            -- cancel_requested) wait again, each counting its dependencies not completed; but
            -- not one with another failed or cancelled dependency (nor, then, its dependents):
            -- it comes back when that one is retried. Their dependencies are locked first: one
            -- completing at this moment is counted completed (its own trigger, looking for
            -- WAITING dependents, cannot see these become WAITING).
            down := __schema__.workflow_downstream(NEW.id);
            back := ARRAY(SELECT c.id FROM __schema__.jobs c WHERE c.id = ANY(down)
                          AND c.status = 'CANCELLED' AND NOT c.cancel_requested ORDER BY c.id);
            PERFORM 1 FROM __schema__.jobs p
            WHERE p.id = ANY(ARRAY(SELECT d.depends_on FROM __schema__.job_dependencies d
                                   WHERE d.job_id = ANY(back)))
            ORDER BY p.id FOR SHARE;
            PERFORM set_config('__schema__.wf_quiet', NEW.workflow_id::text, true);
            UPDATE __schema__.jobs c SET status = 'WAITING', finished_at = NULL,
                updated_at = now(),
                deps_pending = (SELECT count(*) FROM __schema__.job_dependencies d
                                JOIN __schema__.jobs p ON p.id = d.depends_on
                                WHERE d.job_id = c.id AND p.status <> 'COMPLETED')
            WHERE c.id = ANY(back);
            -- now every job still FAILED or CANCELLED stays so: what waits downstream of one,
            -- through the jobs just brought back, is cancelled again (its cause kept)
            WITH RECURSIVE stay(id) AS (
                SELECT d.job_id FROM __schema__.job_dependencies d
                JOIN __schema__.jobs p ON p.id = d.depends_on
                WHERE d.job_id = ANY(back) AND p.status IN ('FAILED', 'CANCELLED')
                UNION
                SELECT d.job_id FROM stay
                JOIN __schema__.job_dependencies d ON d.depends_on = stay.id
                JOIN __schema__.jobs c ON c.id = d.job_id
                WHERE c.status = 'WAITING'
            )
            UPDATE __schema__.jobs c SET status = 'CANCELLED', finished_at = now()
            WHERE c.id = ANY(ARRAY(SELECT id FROM stay)) AND c.status = 'WAITING';
            UPDATE __schema__.jobs c SET last_error = NULL
            WHERE c.id = ANY(back) AND c.status = 'WAITING';
            PERFORM set_config('__schema__.wf_quiet', '', true);
        END IF;
        -- the workflow is open again: not finished (retention goes by finished_at), and
        -- RUNNING unless it was cancelled
        UPDATE __schema__.workflows SET finished_at = NULL,
            status = CASE WHEN cancel_requested THEN status ELSE 'RUNNING' END
        WHERE id = NEW.workflow_id
          AND (finished_at IS NOT NULL OR (status <> 'RUNNING' AND NOT cancel_requested));
    END IF;
    PERFORM set_config('enable_seqscan', seqscan, true);
    PERFORM set_config('enable_mergejoin', mergejoin, true);
    PERFORM set_config('enable_hashjoin', hashjoin, true);
    RETURN NULL;
END
$fn$;

CREATE TRIGGER jobs_workflow_settled AFTER UPDATE OF status ON __schema__.jobs FOR EACH ROW
WHEN (NEW.workflow_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
      AND (NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
           OR OLD.status IN ('COMPLETED', 'FAILED', 'CANCELLED')))
EXECUTE FUNCTION __schema__.workflow_job_settled();

-- At the end of a statement that finished workflow jobs: their dependents counted down
-- together (a dependent of several counted once, by how many of them it waited for), those
-- reaching 0 released with their outbox rows, and the workflows left with no open job finished.
CREATE FUNCTION __schema__.workflow_jobs_finished() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    done uuid[];
    children uuid[];
    counts int[];
    released int;
    waiting uuid[];
    wfs uuid[];
    outs text;
    mode text;
    seqscan text;
BEGIN
    done := string_to_array(NULLIF(current_setting('__schema__.wf_finished', true), ''),
                            ',')::uuid[];
    IF done IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('__schema__.wf_finished', '', true);
    -- the statements below on their generic plans (each planned once per session; the plans
    -- find every row by an index whatever the number of ids), not planned again at each call
    mode := current_setting('plan_cache_mode');
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    -- and each by an index, whatever the statistics were when it was planned
    seqscan := current_setting('enable_seqscan');
    PERFORM set_config('enable_seqscan', 'off', true);
    SELECT array_agg(x.job_id ORDER BY x.job_id), array_agg(x.n ORDER BY x.job_id)
    INTO children, counts
    FROM (SELECT d.job_id, count(*)::int AS n FROM __schema__.job_dependencies d
          WHERE d.depends_on = ANY(done) GROUP BY d.job_id) x;
    IF children IS NOT NULL THEN
        -- several dependents are locked in id order first (two statements releasing never
        -- deadlock); a single one is locked by its update
        IF cardinality(children) > 1 THEN
            PERFORM 1 FROM __schema__.jobs c WHERE c.id = ANY(children)
                AND CASE c.status WHEN 'WAITING' THEN true ELSE false END
            ORDER BY c.id FOR UPDATE;
        END IF;
        WITH r AS (
            UPDATE __schema__.jobs c SET
                deps_pending = c.deps_pending - k.n,
                status = (CASE WHEN c.deps_pending > k.n THEN 'WAITING'
                               WHEN c.run_at > now() THEN 'SCHEDULED'
                               ELSE 'PENDING' END)::__schema__.job_status,
                run_at = CASE WHEN c.deps_pending > k.n OR c.run_at > now() THEN c.run_at
                              ELSE now() END,
                updated_at = CASE WHEN c.deps_pending > k.n THEN c.updated_at ELSE now() END
            FROM unnest(children, counts) AS k(id, n)
            WHERE c.id = k.id AND CASE c.status WHEN 'WAITING' THEN true ELSE false END
            RETURNING c.id, c.job_type, c.priority, c.status, c.workflow_id
        ), ob AS (
            INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
            SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
            RETURNING id
        )
        SELECT count(*) FILTER (WHERE status = 'PENDING'), array_agg(DISTINCT workflow_id),
               (SELECT string_agg(ob.id::text, ',') FROM ob)
        INTO released, waiting, outs FROM r;
        IF released > 0 THEN
            PERFORM pg_notify('__schema___outbox', '');
            -- the outbox rows this statement wrote, for the completing worker's claim
            -- after it (take_released); replaced, not appended to: a transaction of
            -- many releases would copy the growing list at each
            PERFORM set_config('__schema__.wf_released', outs, true);
        END IF;
    END IF;
    -- the finished jobs' workflows (each job read by its primary key), less those with a
    -- dependent counted down just now: it is open, so they have not finished
    wfs := ARRAY(SELECT DISTINCT (SELECT j.workflow_id FROM __schema__.jobs j WHERE j.id = x.id)
                 FROM unnest(done) AS x(id));
    IF NOT COALESCE(waiting @> wfs, false) THEN
        -- those with no open job (a probe each)
        wfs := ARRAY(SELECT v.id FROM unnest(wfs) AS v(id)
                     WHERE NOT v.id = ANY(COALESCE(waiting, ARRAY[]::uuid[]))
                       AND (SELECT true FROM __schema__.jobs x WHERE x.workflow_id = v.id
                            AND x.status IN ('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS',
                                             'RETRYING')
                            LIMIT 1) IS NULL);
        IF cardinality(wfs) > 0 THEN
            -- finished with their status from their jobs; the open test again, in this snapshot
            UPDATE __schema__.workflows w
            SET status = __schema__.workflow_outcome(w.id, w.cancel_requested),
                finished_at = COALESCE(w.finished_at, now())
            WHERE w.id = ANY(wfs)
              AND (SELECT true FROM __schema__.jobs x WHERE x.workflow_id = w.id
                   AND x.status IN ('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING')
                   LIMIT 1) IS NULL
              AND w.status <> __schema__.workflow_outcome(w.id, w.cancel_requested);
        END IF;
    END IF;
    PERFORM set_config('plan_cache_mode', mode, true);
    PERFORM set_config('enable_seqscan', seqscan, true);
    RETURN NULL;
END
$fn$;

CREATE TRIGGER jobs_workflow_finished AFTER UPDATE OF status ON __schema__.jobs
FOR EACH STATEMENT EXECUTE FUNCTION __schema__.workflow_jobs_finished();

-- Before a workflow job leaves its end for PENDING, SCHEDULED or RETRYING (a redrive, a hand
-- re-run): it waits (WAITING) while a dependency is not finished, and stays where it is while
-- one failed or was cancelled under 'cancel' (it comes back when that one is retried).
CREATE FUNCTION __schema__.workflow_job_redriven() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    unmet int;
    dead int;
BEGIN
    -- the dependencies locked first, then counted by a new statement: one finishing at this
    -- moment is counted finished (its own trigger, looking for WAITING dependents, cannot see
    -- this row become WAITING)
    PERFORM 1 FROM __schema__.jobs p
    WHERE p.id = ANY(ARRAY(SELECT depends_on FROM __schema__.job_dependencies
                           WHERE job_id = NEW.id))
    ORDER BY p.id FOR SHARE;
    SELECT count(*) FILTER (WHERE p.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')),
           count(*) FILTER (WHERE w.on_failure = 'cancel'
                            AND p.status IN ('FAILED', 'CANCELLED'))
    INTO unmet, dead
    FROM __schema__.job_dependencies d
    JOIN __schema__.jobs p ON p.id = d.depends_on
    JOIN __schema__.workflows w ON w.id = NEW.workflow_id
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
$fn$;

CREATE TRIGGER jobs_workflow_redriven BEFORE UPDATE OF status ON __schema__.jobs FOR EACH ROW
WHEN (NEW.workflow_id IS NOT NULL AND OLD.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
      AND NEW.status IN ('PENDING', 'SCHEDULED', 'RETRYING'))
EXECUTE FUNCTION __schema__.workflow_job_redriven();

-- Cancel every open job of a workflow (a running one is asked to stop); the number changed.
CREATE FUNCTION __schema__.cancel_workflow(wf uuid) RETURNS integer LANGUAGE plpgsql AS $fn$
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
    UPDATE __schema__.workflows SET cancel_requested = status <> 'COMPLETED',
        status = CASE WHEN status = 'COMPLETED' THEN status ELSE 'CANCELLED' END
    WHERE id = wf;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM __schema__.jobs WHERE workflow_id = wf
        AND status IN ('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING')
    ORDER BY id FOR UPDATE;
    -- every open job of the workflow changes here: nothing downstream is left for each job's
    -- trigger to cancel or count down
    PERFORM set_config('__schema__.wf_quiet', wf::text, true);
    UPDATE __schema__.jobs SET
        status = (CASE WHEN status = 'IN_PROGRESS' THEN 'IN_PROGRESS' ELSE 'CANCELLED' END)
                 ::__schema__.job_status,
        cancel_requested = true,
        last_error = CASE WHEN status = 'IN_PROGRESS' THEN last_error
                          ELSE 'workflow cancelled' END,
        finished_at = CASE WHEN status = 'IN_PROGRESS' THEN NULL ELSE now() END,
        lease_expires_at = CASE WHEN status = 'IN_PROGRESS' THEN lease_expires_at END,
        updated_at = now()
    WHERE workflow_id = wf
      AND status IN ('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING')
      AND NOT (status = 'IN_PROGRESS' AND cancel_requested);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('__schema__.wf_quiet', '', true);
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
$fn$;

-- The dependencies (key -> status and result) of a claim's workflow jobs, one call per claiming
-- statement. PL/pgSQL keeps the query's plan for the session, made with enable_seqscan off:
-- every dependency and every parent is found by its primary key whatever the statistics were
-- when it was planned. A dependency whose row is gone (deleted by hand) is left out.
CREATE FUNCTION __schema__.claimed_parents(ids uuid[]) RETURNS TABLE (job_id uuid, parents text)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
BEGIN
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT d.job_id,
           jsonb_object_agg(p.workflow_key,
                            jsonb_build_object('status', p.status, 'result', p.result))::text
    FROM __schema__.job_dependencies d
    JOIN LATERAL (SELECT p.workflow_key, p.status, p.result FROM __schema__.jobs p
                  WHERE p.id = d.depends_on) p ON true
    WHERE d.job_id = ANY(ids)
    GROUP BY d.job_id;
END
$fn$;

-- The outbox rows the completing statement's release wrote (listed in the setting wf_released
-- by workflow_jobs_finished): at most ``room`` of them, of ``types`` and of no paused type,
-- highest priority first, deleted and their jobs returned for the completing
-- worker to claim. The list is parsed once and each row found by its primary key (planned
-- with the statistics of a nearly empty outbox, a lookup in the claim itself was a sequential
-- scan that parsed the list again for every row: 9.5-11 s for a 9,999-job release).
CREATE FUNCTION __schema__.take_released(types text[], room int) RETURNS TABLE (job_id uuid)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
DECLARE
    listed int8[];
BEGIN
    listed := string_to_array(NULLIF(current_setting('__schema__.wf_released', true), ''),
                              ',')::int8[];
    IF listed IS NULL OR room < 1 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT o.id FROM __schema__.job_outbox o
        WHERE o.id = ANY(listed)
          AND o.destination = 'work'
          AND array_position(types, o.job_type) IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM __schema__.job_types t
                          WHERE t.name = o.job_type AND t.paused)
        ORDER BY o.priority DESC, o.id
        LIMIT room
    ), gone AS (
        DELETE FROM __schema__.job_outbox d WHERE d.id = ANY(ARRAY(SELECT id FROM picked))
        RETURNING d.job_id
    )
    SELECT gone.job_id FROM gone;
END
$fn$;
