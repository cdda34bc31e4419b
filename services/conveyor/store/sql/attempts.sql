-- Jobs as workers see them: claim, heartbeat, outcomes (attempts.py); every write after the
-- claim is fenced by (job id, attempt).
--
-- Status tests are CASEs so that no partial index's predicate follows from them (the planner
-- cannot see through a CASE). Written as ``status IN ('PENDING', 'RETRYING')``, the claim's test
-- implied ``jobs_waiting_idx``'s predicate, and with statistics taken before a backlog arrived
-- the planner ANDed a scan of that whole index with the ids: every claim of a few ids read every
-- waiting job's entry (tests/integration/test_claim_plan.py, stale statistics). Claimable is
-- ``CASE status WHEN 'PENDING' THEN true WHEN 'RETRYING' THEN run_at <= now() + interval
-- '1 second' ELSE false END`` (one second absorbs broker/database clock skew; job_claim_controlled
-- in controls.sql uses the same test). The writes after a claim find their rows by id with
-- ``CASE j.status WHEN 'IN_PROGRESS' THEN true ELSE false END``: ``j.status = 'IN_PROGRESS'``
-- would imply ``jobs_lease_idx``'s predicate, and a plan cached for a fresh install's empty
-- tables joined the ids with a scan of that whole index, dead entries of every job ever claimed
-- included (test_finishing_statements_keep_reading_their_ids_on_one_connection).
--
-- Each finishing statement writes its attempt rows itself: its ``upd`` CTE returns the job's
-- id, type, attempt, worker, start, new status and ``due`` (when the attempt could have started:
-- ``run_at`` for scheduled and retried jobs, else ``created_at``; a statement that rewrites
-- ``run_at`` reads the due time before the update) plus ``error``, and one INSERT INTO
-- job_attempts maps the new status to the attempt's outcome. No ``ON CONFLICT`` (a speculative
-- insertion costs more): every write after a claim is fenced by (job, attempt) and moves the job
-- out of IN_PROGRESS, so an attempt finishes at most once.

-- name: job_claim_many
-- The claim: one conditional UPDATE for a batch of delivered ids. A job is claimable when it is
-- PENDING, or RETRYING and due (a tolerance of one second absorbs broker/database clock skew).
-- The attempt is counted here, so a handler that kills its process still uses up its retries.
-- The ids lead (``jobs_pkey``); the type test is written so no index can serve it: as
-- ``job_type = ANY(:types)`` the planner, for a type ANALYZE has not seen yet (new, or grown
-- since), took the type's whole range of ``jobs_type_status_id_idx`` for one row and filtered
-- the ids out of it (691,500 finished jobs read for 500 ids at 10 million rows;
-- ``tests/integration/test_claim_plan.py``).
UPDATE __schema__.jobs SET
    status = 'IN_PROGRESS',
    attempts = attempts + 1,
    started_at = now(),
    updated_at = now(),
    lease_expires_at = now() + make_interval(secs => :lease_seconds),
    worker_id = :worker_id,
    max_retries = COALESCE(max_retries,
                           (:handler_defaults::jsonb -> job_type ->> 'max_retries')::int,
                           :default_max_retries),
    timeout_seconds = COALESCE(timeout_seconds,
                               (:handler_defaults::jsonb -> job_type ->> 'timeout')::float8)
WHERE id = ANY(:ids::uuid[])
  AND array_position(:types::text[], job_type) IS NOT NULL
  AND CASE status WHEN 'PENDING' THEN true WHEN 'RETRYING'
      THEN run_at <= now() + interval '1 second' ELSE false END
RETURNING id, job_type, payload::text AS payload, priority, attempts, retry_count, max_retries,
          timeout_seconds, meta::text AS meta,
          greatest(0, extract(epoch FROM now() - COALESCE(run_at, created_at)))::float8 AS wait,
          trace_context, workflow_id,
          -- a workflow job's dependencies as its handler sees them (key -> status, result)
          CASE WHEN jobs.workflow_id IS NOT NULL THEN (
              SELECT jsonb_object_agg(p.workflow_key, jsonb_build_object('status', p.status,
                                                                         'result', p.result))
              FROM __schema__.job_dependencies d JOIN __schema__.jobs p ON p.id = d.depends_on
              WHERE d.job_id = jobs.id)::text END AS parents

-- name: job_complete_many
-- A cancellation requested while the job ran wins and discards the result.
WITH upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'COMPLETED' END)
                 ::__schema__.job_status,
        result = CASE WHEN j.cancel_requested THEN NULL ELSE u.result::jsonb END,
        finished_at = now(), updated_at = now(), lease_expires_at = NULL
    FROM unnest($1::uuid[], $2::int4[], $3::text[]) AS u(id, attempt, result)
    WHERE j.id = u.id AND j.attempts = u.attempt AND CASE j.status WHEN 'IN_PROGRESS'
        THEN true ELSE false END
    RETURNING j.id, j.job_type, j.attempts, j.worker_id, j.started_at, j.status,
        COALESCE(j.run_at, j.created_at) AS due, NULL::text AS error
), att AS (
    INSERT INTO __schema__.job_attempts (job_id, attempt, job_type, worker_id,
        started_at, finished_at, outcome, error, duration_seconds, wait_seconds)
    SELECT id, attempts, job_type, worker_id, started_at, now(), CASE
        WHEN status = 'CANCELLED' THEN 'cancelled' ELSE 'completed' END, error,
           extract(epoch FROM now() - started_at)::float8,
           greatest(0, extract(epoch FROM started_at - due))::float8
    FROM upd
)
SELECT id FROM upd

-- name: job_fail_many
-- ``delay`` NULL means retries are exhausted (FAILED + a dead-letter copy); otherwise RETRYING +
-- a message to the holding pen of that delay (0: straight back to the work queue). ``consume``
-- says whether it uses up a retry. ``retry_count`` counts retries performed, so it never exceeds
-- ``max_retries``: a consuming failure with no retry left is FAILED whatever the writer asked
-- (``u.delay IS NULL OR (u.consume AND j.retry_count >= j.max_retries)``: exhausted), and a
-- FAILED or CANCELLED job does not count another retry.
WITH u AS (  -- each failure with its attempt's due time, read before a retry rewrites run_at
    SELECT u.*, COALESCE(o.run_at, o.created_at) AS due
    FROM unnest(:job_id::uuid[], :attempt::int4[], :error::text[], :delay::int4[],
                :consume::bool[])
        AS u(id, attempt, error, delay, consume)
    JOIN __schema__.jobs o ON o.id = u.id
), upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED'
                       WHEN (u.delay IS NULL
                           OR (u.consume AND j.retry_count >= j.max_retries)) THEN 'FAILED'
                       ELSE 'RETRYING' END)::__schema__.job_status,
        last_error = u.error,
        retry_count = j.retry_count + (CASE WHEN u.consume
            AND NOT (u.delay IS NULL OR (u.consume AND j.retry_count >= j.max_retries))
                                            AND NOT j.cancel_requested THEN 1 ELSE 0 END),
        run_at = CASE WHEN (u.delay IS NULL OR (u.consume AND j.retry_count >= j.max_retries))
            THEN j.run_at
                      ELSE now() + make_interval(secs => u.delay) END,
        finished_at = CASE WHEN (u.delay IS NULL
            OR (u.consume AND j.retry_count >= j.max_retries)) OR j.cancel_requested THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM u
    WHERE j.id = u.id AND j.attempts = u.attempt AND CASE j.status WHEN 'IN_PROGRESS'
        THEN true ELSE false END
    RETURNING j.id, j.job_type, j.attempts, j.worker_id, j.started_at, j.status, u.due AS due,
        j.priority, u.delay, u.error
), att AS (
    INSERT INTO __schema__.job_attempts (job_id, attempt, job_type, worker_id,
        started_at, finished_at, outcome, error, duration_seconds, wait_seconds)
    SELECT id, attempts, job_type, worker_id, started_at, now(), CASE status WHEN 'CANCELLED'
        THEN 'cancelled' WHEN 'FAILED' THEN 'failed' ELSE 'retry' END, error,
           extract(epoch FROM now() - started_at)::float8,
           greatest(0, extract(epoch FROM started_at - due))::float8
    FROM upd
), ob AS (  -- a dead letter's error is cut to the wire's limit by the relay (broker/wire.py)
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds,
                                       error, attempt)
    SELECT id, job_type, priority,
           CASE WHEN status = 'FAILED' THEN 'dead' WHEN delay > 0 THEN 'retry' ELSE 'work' END,
           CASE WHEN status = 'RETRYING' AND delay > 0 THEN delay END,
           CASE WHEN status = 'FAILED' THEN error END,
           CASE WHEN status = 'FAILED' THEN attempts END
    FROM upd WHERE status IN ('RETRYING', 'FAILED')
)
SELECT id, status::text AS status FROM upd

-- name: job_release_many
-- Hand a job back without consuming a retry (graceful shutdown that could not finish it).
WITH upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END)
                 ::__schema__.job_status,
        finished_at = CASE WHEN j.cancel_requested THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
    WHERE j.id = u.id AND j.attempts = u.attempt AND CASE j.status WHEN 'IN_PROGRESS'
        THEN true ELSE false END
    RETURNING j.id, j.job_type, j.attempts, j.worker_id, j.started_at, j.status,
        COALESCE(j.run_at, j.created_at) AS due, j.priority, NULL::text AS error
), att AS (
    INSERT INTO __schema__.job_attempts (job_id, attempt, job_type, worker_id,
        started_at, finished_at, outcome, error, duration_seconds, wait_seconds)
    SELECT id, attempts, job_type, worker_id, started_at, now(), CASE
        WHEN status = 'CANCELLED' THEN 'cancelled' ELSE 'released' END, error,
           extract(epoch FROM now() - started_at)::float8,
           greatest(0, extract(epoch FROM started_at - due))::float8
    FROM upd
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM upd WHERE status = 'PENDING'
)
SELECT id FROM upd

-- name: job_heartbeat_many
UPDATE __schema__.jobs j SET lease_expires_at = now() + make_interval(secs => $3)
FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
WHERE j.id = u.id AND j.attempts = u.attempt AND CASE j.status WHEN 'IN_PROGRESS'
    THEN true ELSE false END
RETURNING j.id, j.cancel_requested

-- name: job_touch_waiting
-- Deliveries a worker holds while it waits for a free slot: their jobs are in hand, not lost,
-- and their messages are not among the queue's *ready* ones, which is all the reconciler sees.
-- The touch marks them *held* until ``$2`` seconds from now (``lease_expires_at`` of a waiting
-- job; ``store/maintenance.py``'s ``UNHELD``): the reconciler counts a held job neither as overdue
-- nor as fresh (a fresh job stands for a ready message). A holder that dies stops touching; the
-- broker requeues its unacknowledged deliveries and the hold runs out.
UPDATE __schema__.jobs SET updated_at = now(), lease_expires_at = now() + make_interval(secs => $2)
WHERE id = ANY($1::uuid[]) AND CASE status WHEN 'PENDING' THEN true WHEN 'RETRYING'
    THEN true ELSE false END
