-- name: job_row fragment
-- The columns of a job as ``JobRow.from_record`` reads them (the jobs row's own names).
id, job_type, status::text AS status, priority, payload::text AS payload, result::text AS result,
max_retries, timeout_seconds, retry_count, attempts, last_error, run_at, lease_expires_at,
worker_id, cancel_requested, idempotency_key, request_hash, created_at, updated_at, started_at,
finished_at, progress::text AS progress, meta::text AS meta, workflow_id, partition_key

-- name: job_get
SELECT {{job_row}}, ARRAY(SELECT d.depends_on FROM __schema__.job_dependencies d
                       WHERE d.job_id = jobs.id ORDER BY d.depends_on) AS depends_on,
    __schema__.waiting_for(jobs) AS waiting_for
FROM __schema__.jobs WHERE id = $1

-- name: job_get_by_idempotency_key
SELECT {{job_row}}
FROM __schema__.jobs WHERE idempotency_key = $1

-- name: job_cancel
-- ``cancel_job`` (schema/operator.sql): the id when the job was cancelled (or, running, asked
-- to stop).
SELECT $1::uuid AS id WHERE __schema__.cancel_job($1) IS NOT NULL

-- name: statement_bound
-- First in a transaction that settles jobs (the API's cancel, the sweeper's lease recovery): its
-- statements end at $1 and its lock waits at $2 (``bounds.local_bounds``), with 57014 or 55P03,
-- so one job whose row is locked elsewhere, or whose triggers are slow, answers within the
-- caller's time limit; and the session ends when it sits idle inside the transaction for $3 (its
-- process paused while it holds the rows it settles), also where the session has no such bound.
-- SET LOCAL: all three end with the transaction.
SELECT set_config('statement_timeout', $1, true) AS statement,
       set_config('lock_timeout', $2, true) AS lock_wait,
       set_config('idle_in_transaction_session_timeout', $3, true) AS idle

-- name: job_redrive
-- Redrive: FAILED or CANCELLED → PENDING with fresh retries; a cancelled job whose ``run_at`` is
-- still ahead (a cancelled scheduled job) goes back to SCHEDULED with it, and the promoter
-- publishes it when due. ``attempts`` is never reset: it is the fencing token and only grows.
WITH r AS (
    UPDATE __schema__.jobs SET
    status = (CASE WHEN status = 'CANCELLED' AND attempts = 0 AND run_at > now()
                   THEN 'SCHEDULED' ELSE 'PENDING' END)::__schema__.job_status,
    run_at = CASE WHEN status = 'CANCELLED' AND attempts = 0 AND run_at > now()
                  THEN run_at END,
    retry_count = 0, cancel_requested = false, result = NULL, finished_at = NULL,
    lease_expires_at = NULL, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND status IN ('FAILED', 'CANCELLED')
    RETURNING id, job_type, priority, status
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
)
SELECT id FROM r

-- name: job_redrive_failed
-- The SET is job_redrive's.
-- The dead-letter tools' redrive: only a job still in the failure its dead letter recorded
-- (FAILED at that attempt). A job redriven since — then cancelled, completed or failed again
-- (a newer dead letter exists) — is left alone, and the caller drops the stale letter.
WITH r AS (
    UPDATE __schema__.jobs j SET
    status = (CASE WHEN status = 'CANCELLED' AND attempts = 0 AND run_at > now()
                   THEN 'SCHEDULED' ELSE 'PENDING' END)::__schema__.job_status,
    run_at = CASE WHEN status = 'CANCELLED' AND attempts = 0 AND run_at > now()
                  THEN run_at END,
    retry_count = 0, cancel_requested = false, result = NULL, finished_at = NULL,
    lease_expires_at = NULL, updated_at = now()
    FROM unnest($1::uuid[], $2::int4[]) AS u(id, attempt)
    WHERE j.id = u.id AND j.attempts = u.attempt AND j.status = 'FAILED'
    RETURNING j.id, j.job_type, j.priority, j.status
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
)
SELECT id FROM r

-- name: job_fence_many
-- The dead-letter tools compare a letter's attempt with the job's (stale unless FAILED at it);
-- the worker explains a dropped delivery by its job's status.
SELECT id, status::text AS status, attempts FROM __schema__.jobs WHERE id = ANY($1::uuid[])

-- name: job_insert
-- A submit: jobs and their outbox rows in one statement (atomic without a transaction). The
-- parameters are column arrays (``jobs.insert_arrays``); ``trace_context`` (one traceparent
-- for the whole submit) and each row's ``meta`` and unique key may be NULL. A row whose unique
-- key is held (and not expired, nor held by one of ``among``) is not inserted, nor one whose
-- idempotency key exists.
WITH u AS (
    SELECT * FROM unnest(:id::uuid[], :job_type::text[], :payload::text[], :priority::int2[],
                         :max_retries::int4[], :timeout_seconds::float8[],
                         :run_at::timestamptz[], :delay::float8[], :idempotency_key::text[],
                         :request_hash::text[], :meta::text[], :unique_key::text[],
                         :unique_for::float8[], :partition_key::text[]) WITH ORDINALITY
        AS u(id, job_type, payload, priority, max_retries, timeout_seconds, run_at, delay,
             ikey, rhash, meta, ukey, ufor, given_key, ord)
), firsts AS (  -- two rows of one statement with the same key: the first one claims it
    SELECT DISTINCT ON (ukey) id, ukey, ufor FROM u WHERE ukey IS NOT NULL ORDER BY ukey, ord
), won AS (
    INSERT INTO __schema__.job_uniques AS k (key, job_id, expires_at)
    SELECT ukey, id, now() + make_interval(secs => ufor) FROM firsts
    ON CONFLICT (key) DO UPDATE SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at
    WHERE k.expires_at <= now() OR k.job_id = ANY(:among::uuid[])
    RETURNING job_id
), v AS (
    SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay)) AS due,
           {{admission_key}}
    FROM u {{admission_join}}
    WHERE u.ukey IS NULL OR u.id IN (SELECT job_id FROM won)
), ins AS (
    INSERT INTO __schema__.jobs (id, job_type, status, priority, payload, max_retries,
                                 timeout_seconds, run_at, idempotency_key, request_hash, meta,
                                 trace_context, partition_key, admit_seq)
    SELECT id, job_type,
           (CASE WHEN pkey IS NOT NULL THEN 'WAITING' WHEN due > now() THEN 'SCHEDULED'
                 ELSE 'PENDING' END)::__schema__.job_status,
           priority, payload::jsonb, max_retries, timeout_seconds, due, ikey, rhash, meta::jsonb,
           :trace_context::text, pkey, seq
    FROM v ORDER BY ord  -- the submit's order: its outbox rows, hence its messages, follow it
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM ins WHERE status = 'PENDING'
)
SELECT {{job_row}}
FROM ins

-- name: job_debounce
-- A debounced submit (one job): inserted WAITING for admission, due ``:debounce_seconds`` from
-- now; or, while a job of its type and debounce key waits (never started), folded into it: that
-- job takes this payload and meta, and its run_at moves to ``:debounce_seconds`` from now but
-- never past its ``debounce_until`` (the first submit plus ``:debounce_max``). ``debounced``:
-- folded. Concurrent submits with one key wait for each other on ``jobs_debounce_idx``, at most
-- ``:wait_bound`` (``lock_timeout``, set before the insert reads its row and returned as
-- ``bound_before`` for the caller to restore): an application's open transaction that
-- submitted with the key makes this one fail with 55P03 rather than hang.
WITH b AS MATERIALIZED (
    SELECT current_setting('lock_timeout') AS before, set_config('lock_timeout', :wait_bound, true)
), u AS (
    SELECT :id::uuid AS id, :job_type::text AS job_type, :payload::text AS payload,
           :priority::int2 AS priority, :max_retries::int4 AS max_retries,
           :timeout_seconds::float8 AS timeout_seconds, :meta::text AS meta,
           :partition_key::text AS given_key, :idempotency_key::text AS ikey,
           :request_hash::text AS rhash
), v AS (
    SELECT u.*, b.before, {{admission_key}} FROM b, u {{admission_join}}
)
INSERT INTO __schema__.jobs AS j (id, job_type, status, priority, payload, max_retries,
                                  timeout_seconds, idempotency_key, request_hash, run_at, meta,
                                  trace_context, partition_key, admit_seq, debounce_key,
                                  debounce_until)
SELECT id, job_type, 'WAITING', priority, payload::jsonb, max_retries, timeout_seconds, ikey, rhash,
       now() + make_interval(secs => :debounce_seconds), meta::jsonb, :trace_context::text,
       COALESCE(pkey, ''), seq, COALESCE(:debounce_key::text, NULLIF(pkey, ''), job_type),
       now() + make_interval(secs => :debounce_max)
FROM v
ON CONFLICT (job_type, debounce_key)
    WHERE status = 'WAITING' AND debounce_key IS NOT NULL AND attempts = 0
DO UPDATE SET payload = EXCLUDED.payload, meta = EXCLUDED.meta,
    run_at = least(EXCLUDED.run_at, j.debounce_until), updated_at = now()
RETURNING {{job_row}}, NOT (xmax = 0) AS debounced, (SELECT before FROM b) AS bound_before

-- name: admission_join fragment
-- A submit's rows (``u``: ``job_type``, ``payload``, ``given_key``: the submit's partition key) with
-- their type's row when the type goes through admission (admission.sql): a type without limits
-- finds no row, and its jobs no partition key.
LEFT JOIN __schema__.job_types t ON t.name = u.job_type AND __schema__.admitted_type(t)

-- name: admission_key fragment
-- The columns ``admission_join`` adds: the partition key (NULL: no admission) and the ordered
-- place to take at commit (0; NULL: not ordered).
CASE WHEN t.name IS NOT NULL OR u.given_key IS NOT NULL
     THEN __schema__.partition_key_for(t, u.given_key, u.payload::jsonb) END AS pkey,
CASE WHEN t.ordered IS NOT NULL THEN 0::bigint END AS seq

-- name: job_unique_holders
-- The holders of keys: the job (NULL columns when it no longer exists) by key.
SELECT k.key AS unique_key, k.job_id AS holder, j.*
FROM __schema__.job_uniques k
LEFT JOIN LATERAL (
    SELECT {{job_row}}
    FROM __schema__.jobs WHERE id = k.job_id
) j ON true
WHERE k.key = ANY($1::text[])

-- name: job_unique_delete_expired
DELETE FROM __schema__.job_uniques WHERE key IN (
    SELECT key FROM __schema__.job_uniques WHERE expires_at < now() ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED
)

-- name: job_unique_wait_bound
-- Inside a transaction: how long a statement may wait for a lock (a key another open
-- transaction is claiming) before it fails with SQLSTATE 55P03; ends with the transaction.
-- Returns the bound it replaces.
SELECT current_setting('lock_timeout') AS before, set_config('lock_timeout', $1, true)
