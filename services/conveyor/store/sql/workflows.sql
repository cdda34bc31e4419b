-- Workflows (workflows.py; the release, the failure policy and the workflow's status are the
-- triggers of schema/workflows.sql, on every path that changes a workflow job's status).

-- name: workflow_attach
-- A submitted workflow: its row, its dependency edges, and its jobs (inserted just before by the
-- submit's own statement, in this transaction) tagged with the workflow and their keys. A job
-- with dependencies was inserted parked (``run_at`` at the end of time: SCHEDULED, no outbox
-- row); it becomes WAITING with its own due time (``run_at``, else now + ``delay``).
WITH w AS (
    INSERT INTO __schema__.workflows (id, name, on_failure)
    VALUES (:workflow_id, :name, :on_failure)
), dep AS (
    INSERT INTO __schema__.job_dependencies (job_id, depends_on)
    SELECT * FROM unnest(:child::uuid[], :parent::uuid[])
), k AS (
    SELECT * FROM unnest(:job_id::uuid[], :job_key::text[], :deps::int4[],
                         :run_at::timestamptz[], :delay::float8[])
        AS k(id, key, deps, run_at, delay)
), upd AS (
    UPDATE __schema__.jobs j SET workflow_id = :workflow_id, workflow_key = k.key,
        deps_pending = k.deps,
        status = (CASE WHEN k.deps > 0 THEN 'WAITING' ELSE j.status::text END)
                 ::__schema__.job_status,
        run_at = CASE WHEN k.deps > 0
                      THEN COALESCE(k.run_at, now() + make_interval(secs => k.delay))
                      ELSE j.run_at END
    FROM k WHERE j.id = k.id
    RETURNING j.status
)
SELECT count(*) FILTER (WHERE status = 'PENDING') AS pending, count(*) AS n FROM upd

-- name: workflow_get
SELECT workflow_id AS id, name, status, on_failure, created_at, finished_at, jobs, waiting,
       queued, running, completed, failed, cancelled
FROM __schema__.workflow_counts WHERE workflow_id = $1

-- name: workflow_jobs
-- A workflow's jobs (by id), each with the keys it waits for: its dependencies found by id
-- (``= ANY``), never by a join the statistics of a just-submitted workflow plan as a scan of
-- ``jobs`` per job (9 s for 10,000 jobs).
SELECT j.id, j.workflow_key AS key, j.job_type, j.status::text AS status, j.deps_pending,
       j.last_error,
       ARRAY(SELECT p.workflow_key FROM __schema__.jobs p
             WHERE p.id = ANY(ARRAY(SELECT d.depends_on FROM __schema__.job_dependencies d
                                    WHERE d.job_id = j.id))
             ORDER BY p.workflow_key) AS after
FROM __schema__.jobs j WHERE j.workflow_id = $1 ORDER BY j.id

-- name: workflow_parents
-- What a claimed workflow job's handler sees of its dependencies: key, status, result.
SELECT d.job_id, p.workflow_key AS key, p.status::text AS status, p.result::text AS result
FROM __schema__.job_dependencies d JOIN __schema__.jobs p ON p.id = d.depends_on
WHERE d.job_id = ANY($1::uuid[])

-- name: workflow_cancel
SELECT __schema__.cancel_workflow($1)

-- name: workflow_finish
-- The finishing duty's backstop: the last two open jobs of a workflow ending at once each see
-- the other open, and neither finishes it (the trigger's test reads its own snapshot). A
-- running workflow with no open job takes its status from its jobs here. So does a cancelled
-- one (``cancel_workflow`` marks it CANCELLED at once) once the jobs it asked to stop ended:
-- its ``finished_at``, which retention goes by. The workflows are found by id (``= ANY``), never
-- by a join the planner may turn into a scan of every workflow (it did, twice, on 20,000).
WITH open AS (  -- each on its partial index
    SELECT id FROM __schema__.workflows WHERE status = 'RUNNING'
    UNION ALL
    SELECT id FROM __schema__.workflows WHERE status = 'CANCELLED' AND finished_at IS NULL
), done AS (
    SELECT w.id FROM __schema__.workflows w
    WHERE w.id = ANY(ARRAY(SELECT id FROM open)) AND NOT EXISTS (
        SELECT 1 FROM __schema__.jobs x WHERE x.workflow_id = w.id
          AND x.status IN ('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING'))
    ORDER BY w.created_at LIMIT $1 FOR UPDATE OF w SKIP LOCKED
)
UPDATE __schema__.workflows w SET finished_at = now(),
    status = __schema__.workflow_outcome(w.id, w.cancel_requested)
WHERE w.id = ANY(ARRAY(SELECT id FROM done))

-- name: workflow_reopen
-- The other side of that race: a job reopened while the backstop finished its workflow (the
-- reopening trigger saw it running). A workflow finished in the last hour with an open job is
-- open again: no ``finished_at``, and RUNNING unless it was cancelled.
UPDATE __schema__.workflows w SET finished_at = NULL,
    status = CASE WHEN w.cancel_requested THEN w.status ELSE 'RUNNING' END
WHERE w.status <> 'RUNNING' AND w.finished_at > now() - interval '1 hour'
  AND EXISTS (SELECT 1 FROM __schema__.jobs x WHERE x.workflow_id = w.id
              AND x.status IN ('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS', 'RETRYING'))

-- name: workflow_delete_expired
-- Retention of workflows: a finished one goes whole, with its jobs, their attempts and their
-- edges, once its finish is older than ``$1`` seconds (COMPLETED) or ``$2`` (FAILED,
-- CANCELLED); the jobs' own retention leaves workflow jobs alone (maintenance.sql). Rows found
-- by id (``= ANY``): joined, the edges and the workflows were each a sequential scan. The
-- shorter of the two ages bounds the range of ``workflows_finished_idx`` the pass reads: the
-- per-status age alone is no index condition, and an idle pass read every finished workflow
-- (200,000 in 108 ms). A workflow with an open job is never deleted, whatever its
-- ``finished_at`` says (a job reopened it; the reopening trigger clears it in the same
-- transaction, this test keeps a hand edit of the row from costing a running job). A reopening
-- transaction holds the workflow row (FOR SHARE) until it commits: this pass skips it.
WITH w AS (
    SELECT id FROM __schema__.workflows w
    WHERE status <> 'RUNNING'
      AND finished_at < now() - make_interval(secs => least($1::float8, $2::float8))
      AND finished_at < now() - make_interval(
        secs => CASE WHEN status = 'COMPLETED' THEN $1::float8 ELSE $2::float8 END)
      AND NOT EXISTS (SELECT 1 FROM __schema__.jobs x WHERE x.workflow_id = w.id
                      AND x.status IN ('WAITING', 'PENDING', 'SCHEDULED', 'IN_PROGRESS',
                                       'RETRYING'))
    ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED
), j AS (
    DELETE FROM __schema__.jobs j USING w WHERE j.workflow_id = w.id RETURNING j.id
), a AS (
    DELETE FROM __schema__.job_attempts a USING j WHERE a.job_id = j.id
), d AS (
    DELETE FROM __schema__.job_dependencies d WHERE d.job_id = ANY(ARRAY(SELECT id FROM j))
)
DELETE FROM __schema__.workflows x WHERE x.id = ANY(ARRAY(SELECT id FROM w))

-- name: workflow_insert
-- A submitted workflow in one statement, when none of its jobs has a unique key (those take
-- ``job_insert_checked`` + ``workflow_attach``): the workflow row, the edges and the jobs as
-- ``job_insert`` writes them, each WAITING when it has dependencies (no outbox row), else
-- PENDING with its outbox row or SCHEDULED. A job refused by its idempotency key is missing
-- from ``ids``.
WITH w AS (
    INSERT INTO __schema__.workflows (id, name, on_failure)
    VALUES (:workflow_id, :name, :on_failure)
), dep AS (
    INSERT INTO __schema__.job_dependencies (job_id, depends_on)
    SELECT * FROM unnest(:child::uuid[], :parent::uuid[])
), u AS (
    SELECT * FROM unnest(:id::uuid[], :job_type::text[], :payload::text[], :priority::int2[],
                         :max_retries::int4[], :timeout_seconds::float8[],
                         :run_at::timestamptz[], :delay::float8[], :idempotency_key::text[],
                         :request_hash::text[], :meta::text[], :job_key::text[], :deps::int4[],
                         :partition_key::text[])
        AS u(id, job_type, payload, priority, max_retries, timeout_seconds, run_at, delay,
             ikey, rhash, meta, key, deps, given_key)
), v AS (
    SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay)) AS due,
           {{admission_key}}
    FROM u {{admission_join}}
), ins AS (
    INSERT INTO __schema__.jobs (id, job_type, status, priority, payload, max_retries,
                                 timeout_seconds, run_at, idempotency_key, request_hash, meta,
                                 trace_context, workflow_id, workflow_key, deps_pending,
                                 partition_key, admit_seq)
    SELECT id, job_type,
           (CASE WHEN deps > 0 OR pkey IS NOT NULL THEN 'WAITING' WHEN due > now() THEN 'SCHEDULED'
                 ELSE 'PENDING' END)::__schema__.job_status,
           priority, payload::jsonb, max_retries, timeout_seconds, due, ikey, rhash, meta::jsonb,
           :trace_context::text, :workflow_id, key, deps, pkey, seq
    FROM v
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, job_type, priority, status
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM ins WHERE status = 'PENDING'
)
SELECT COALESCE(array_agg(id), '{}') AS ids, count(*) FILTER (WHERE status = 'PENDING') AS pending
FROM ins
