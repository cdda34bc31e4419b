-- Jobs as workers see them: the claims (plain and limited), heartbeat, progress, outcomes and
-- the attempt history (attempts.py); every write after the claim is fenced by (job id, attempt).
--
-- Status tests are CASEs so that no partial index's predicate follows from them (the planner
-- cannot see through a CASE). Written as ``status IN ('PENDING', 'RETRYING')``, the claim's test
-- implied ``jobs_waiting_idx``'s predicate, and with statistics taken before a backlog arrived
-- the planner ANDed a scan of that whole index with the ids: every claim of a few ids read every
-- waiting job's entry (tests/integration/test_claim_plan.py, stale statistics). Claimable is
-- the fragment ``job_claimable``, which every claiming statement includes. The writes after a
-- claim find their rows by id with
-- ``CASE j.status WHEN 'IN_PROGRESS' THEN true ELSE false END``: ``j.status = 'IN_PROGRESS'``
-- would imply ``jobs_lease_idx``'s predicate, and a plan cached for a fresh install's empty
-- tables joined the ids with a scan of that whole index, dead entries of every job ever claimed
-- included (test_finishing_statements_keep_reading_their_ids_on_one_connection). That test is
-- part of the fragment ``job_fenced``.
--
-- Each finishing statement writes its attempt rows itself: its ``upd`` CTE returns the job's
-- id, type, attempt, worker, start and ``due`` (when the attempt could have started: ``run_at``
-- for scheduled and retried jobs, else ``created_at``; a statement that rewrites ``run_at``
-- reads the due time before the update) plus ``error`` and the ``outcome`` its new status means,
-- and its ``att`` CTE is the fragment ``job_attempt_insert``. No ``ON CONFLICT`` (a speculative
-- insertion costs more): every write after a claim is fenced by (job, attempt) and moves the job
-- out of IN_PROGRESS, so an attempt finishes at most once.

-- name: job_claimable fragment
-- Claimable (the jobs row is ``j``): PENDING, or RETRYING and due; one second absorbs
-- broker/database clock skew. A CASE, as the header explains.
CASE j.status WHEN 'PENDING' THEN true
    WHEN 'RETRYING' THEN j.run_at <= now() + interval '1 second' ELSE false END

-- name: job_fenced fragment
-- The fence of every write after a claim: the jobs row ``j`` is the attempt ``u`` (``id``,
-- ``attempt``) and still running. A CASE, as the header explains.
(j.id = u.id AND j.attempts = u.attempt
 AND CASE j.status WHEN 'IN_PROGRESS' THEN true ELSE false END)

-- name: job_attempt_insert fragment
-- The attempt rows of a finishing statement, from its ``upd`` CTE (see the header).
INSERT INTO __schema__.job_attempts (job_id, attempt, job_type, worker_id, started_at,
    finished_at, outcome, error, duration_seconds, wait_seconds)
SELECT id, attempts, job_type, worker_id, started_at, now(), outcome, error,
       extract(epoch FROM now() - started_at)::float8,
       greatest(0, extract(epoch FROM started_at - due))::float8
FROM upd

-- name: claimed_with_parents fragment
-- The final SELECT of a claiming statement whose claimed rows are the CTE ``claimed``: each row
-- with its dependencies as its handler sees them (``parents``: key -> status, result; NULL for
-- a plain job). One call of ``claimed_parents`` for all the statement's
-- workflow jobs, which finds each dependency and parent by its primary key whatever the
-- statistics this statement's plan was made with.
SELECT c.*, p.parents FROM claimed c
LEFT JOIN __schema__.claimed_parents(ARRAY(SELECT id FROM claimed WHERE workflow_id IS NOT NULL)) p
    ON p.job_id = c.id

-- name: job_claim_set fragment
-- What a claim writes into the jobs row ``j`` (a SET list): the attempt counted, the lease, and
-- what the submitter left out from the handler's defaults.
status = 'IN_PROGRESS',
attempts = j.attempts + 1,
started_at = statement_timestamp(),
updated_at = statement_timestamp(),
lease_expires_at = statement_timestamp() + make_interval(secs => :lease_seconds),
worker_id = :worker_id,
max_retries = COALESCE(j.max_retries,
                       (:handler_defaults::jsonb -> j.job_type ->> 'max_retries')::int,
                       :default_max_retries),
timeout_seconds = COALESCE(j.timeout_seconds,
                           (:handler_defaults::jsonb -> j.job_type ->> 'timeout')::float8)

-- name: job_claimed_row fragment
-- What a claim returns of the jobs row ``j`` (``ClaimedJob.from_record``), less the parents
-- (``claimed_with_parents``).
j.id, j.job_type, j.payload::text AS payload, j.priority, j.attempts, j.retry_count,
j.max_retries, j.timeout_seconds, j.meta::text AS meta,
greatest(0, extract(epoch FROM statement_timestamp()
                                - COALESCE(j.run_at, j.created_at)))::float8 AS wait,
j.trace_context, j.workflow_id, j.partition_key IS NOT NULL AS admitted

-- name: job_claim_many
-- The claim: one conditional UPDATE for a batch of delivered ids (``job_claimable``).
-- The attempt is counted here, so a handler that kills its process still uses up its retries.
-- The ids lead (``jobs_pkey``); the type test is written so no index can serve it: as
-- ``job_type = ANY(:types)`` the planner, for a type ANALYZE has not seen yet (new, or grown
-- since), took the type's whole range of ``jobs_type_status_id_idx`` for one row and filtered
-- the ids out of it (691,500 finished jobs read for 500 ids at 10 million rows;
-- ``tests/integration/test_claim_plan.py``).
WITH claimed AS (
    UPDATE __schema__.jobs j SET {{job_claim_set}}
    WHERE j.id = ANY(:ids::uuid[])
      AND array_position(:types::text[], job_type) IS NOT NULL
      AND {{job_claimable}}
    RETURNING {{job_claimed_row}}
)
{{claimed_with_parents}}

-- name: job_claim_released
-- The completing worker takes jobs its completions released (worker/completer.py): inside the
-- completing transaction, after the completion statement (nothing between them releases jobs),
-- whose trigger listed the outbox rows it wrote in the transaction's setting
-- ``__schema__.wf_released`` (the last releasing statement's rows only). At most
-- ``:room`` of them (highest priority first), of this worker's types, none of a paused type
-- (a job under admission is released WAITING, with no outbox row): ``take_released`` (each
-- row found by its primary key, however many were released) deletes their outbox rows, so they get no broker message, and returns their jobs, claimed here; the rest stay for
-- the relay. The rows are this transaction's own (uncommitted until it commits), so no relay
-- can hold them, and their jobs were released by it (PENDING, locked by it): each is claimed.
-- ``ARRAY(subquery)`` calls the function once, not once per row the plan reads.
WITH claimed AS (
    UPDATE __schema__.jobs j SET {{job_claim_set}}
    WHERE j.id = ANY(ARRAY(SELECT r.job_id
                           FROM __schema__.take_released(:types::text[], :room::int) r))
      AND {{job_claimable}}
    RETURNING {{job_claimed_row}}
)
{{claimed_with_parents}}

-- name: job_complete_many
-- A cancellation requested while the job ran wins and discards the result.
WITH upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'COMPLETED' END)
                 ::__schema__.job_status,
        result = CASE WHEN j.cancel_requested THEN NULL ELSE u.result::jsonb END,
        finished_at = now(), updated_at = now(), lease_expires_at = NULL
    FROM unnest($1::uuid[], $2::int4[], $3::text[]) AS u(id, attempt, result)
    WHERE {{job_fenced}}
    RETURNING j.id, j.job_type, j.attempts, j.worker_id, j.started_at,
        COALESCE(j.run_at, j.created_at) AS due, NULL::text AS error,
        CASE WHEN j.status = 'CANCELLED' THEN 'cancelled' ELSE 'completed' END AS outcome
), att AS ({{job_attempt_insert}}
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
    WHERE {{job_fenced}}
    RETURNING j.id, j.job_type, j.attempts, j.worker_id, j.started_at, j.status, u.due AS due,
        j.priority, u.delay, u.error, CASE j.status WHEN 'CANCELLED' THEN 'cancelled'
                                      WHEN 'FAILED' THEN 'failed' ELSE 'retry' END AS outcome
), att AS ({{job_attempt_insert}}
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
    WHERE {{job_fenced}}
    RETURNING j.id, j.job_type, j.attempts, j.worker_id, j.started_at, j.status,
        COALESCE(j.run_at, j.created_at) AS due, j.priority, NULL::text AS error,
        CASE WHEN j.status = 'CANCELLED' THEN 'cancelled' ELSE 'released' END AS outcome
), att AS ({{job_attempt_insert}}
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM upd WHERE status = 'PENDING'
)
SELECT id FROM upd

-- name: job_heartbeat_many
-- Extends the lease of each attempt still running. A beat never waits on a row lock: a row
-- locked elsewhere is skipped and reported ``busy`` (neither extended nor lost; the next beat
-- tries again). The worker's own outcome batch holds such rows while it waits on a lock of its
-- own (a dependent's row held by a frozen peer's release, until PostgreSQL ends that session),
-- and a beat waiting behind it would let the lease of every other job of the worker run out.
-- A job missing from the answer lost its lease (taken over, or its row is gone).
WITH u AS (SELECT * FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)),
held AS (
    SELECT j.id FROM __schema__.jobs j JOIN u ON {{job_fenced}}
    ORDER BY j.id FOR UPDATE OF j SKIP LOCKED
), upd AS (
    UPDATE __schema__.jobs j SET lease_expires_at = now() + make_interval(secs => $3)
    FROM held WHERE j.id = held.id
    RETURNING j.id, j.cancel_requested
)
SELECT j.id, upd.cancel_requested, upd.id IS NULL AS busy
FROM __schema__.jobs j JOIN u ON {{job_fenced}} LEFT JOIN upd ON upd.id = j.id

-- name: job_note_many
-- Why a running attempt holds its job (``last_error`` of the IN_PROGRESS row: its work was given
-- up on past its timeout and still runs, worker/executor.py); fenced like every write of an
-- attempt. The attempt's outcome overwrites it.
UPDATE __schema__.jobs j SET last_error = u.note, updated_at = now()
FROM unnest($1::uuid[], $2::int4[], $3::text[]) AS u(id, attempt, note)
WHERE {{job_fenced}}
RETURNING j.id

-- name: job_touch_waiting
-- Deliveries a worker holds while it waits for a free slot: their jobs are in hand, not lost,
-- and their messages are not among the queue's *ready* ones, which is all the reconciler sees.
-- The touch marks them *held* until ``$2`` seconds from now (``lease_expires_at`` of a waiting
-- job; ``maintenance.sql``'s ``job_unheld``): the reconciler counts a held job neither as
-- overdue nor as fresh (a fresh job stands for a ready message). A holder that dies stops touching; the
-- broker requeues its unacknowledged deliveries and the hold runs out.
-- Like the heartbeat, it skips rows locked elsewhere (a claim in flight) instead of waiting.
UPDATE __schema__.jobs SET updated_at = now(), lease_expires_at = now() + make_interval(secs => $2)
WHERE id IN (
    SELECT id FROM __schema__.jobs WHERE id = ANY($1::uuid[]) AND CASE status WHEN 'PENDING'
        THEN true WHEN 'RETRYING' THEN true ELSE false END
    ORDER BY id FOR UPDATE SKIP LOCKED)

-- name: job_progress_many
-- Fenced like every write of an attempt (``job_fenced``): a stale attempt's report changes
-- nothing.
UPDATE __schema__.jobs j SET
    progress = jsonb_build_object('percent', u.percent, 'message', u.message,
                                  'updated_at', now())
FROM unnest($1::uuid[], $2::int4[], $3::float8[], $4::text[])
    AS u(id, attempt, percent, message)
WHERE {{job_fenced}}
RETURNING j.id

-- name: job_completed_among
-- In the completing transaction, after ``job_complete_many``: which of the attempts it wrote
-- ended COMPLETED (not CANCELLED by a cancel requested while they ran).
SELECT j.id FROM __schema__.jobs j
JOIN unnest($1::uuid[], $2::int4[]) AS u(id, attempt) ON j.id = u.id
WHERE j.attempts = u.attempt AND j.status = 'COMPLETED'

-- name: job_attempt_list
-- Oldest first. One row with a NULL attempt: the job exists but never ran; no row: no such job.
WITH j AS (
    SELECT id, status, attempts, worker_id, started_at FROM __schema__.jobs WHERE id = $1
)
SELECT a.attempt, a.worker_id, a.started_at, a.finished_at, a.outcome, a.error,
       a.duration_seconds
FROM j LEFT JOIN LATERAL (
    SELECT attempt, worker_id, started_at, finished_at, outcome, error, duration_seconds
    FROM __schema__.job_attempts WHERE job_id = j.id
    UNION ALL
    SELECT j.attempts, j.worker_id, j.started_at, NULL, NULL, NULL, NULL
    WHERE j.status = 'IN_PROGRESS'
) a ON true
ORDER BY a.attempt
