-- name: job_insert_full
-- job_insert_many with ``meta`` and unique keys, for rows that carry either (unique.py): a
-- row whose key is held (and not expired, nor held by one of ``among``) is not inserted.
WITH u AS (
    SELECT * FROM unnest(:id::uuid[], :job_type::text[], :payload::text[], :priority::int2[],
                         :max_retries::int4[], :timeout_seconds::float8[],
                         :run_at::timestamptz[], :delay::float8[], :idempotency_key::text[],
                         :request_hash::text[], :meta::text[], :unique_key::text[],
                         :unique_for::float8[]) WITH ORDINALITY
        AS u(id, job_type, payload, priority, max_retries, timeout_seconds, run_at, delay,
             ikey, rhash, meta, ukey, ufor, ord)
), firsts AS (  -- two rows of one statement with the same key: the first one claims it
    SELECT DISTINCT ON (ukey) id, ukey, ufor FROM u WHERE ukey IS NOT NULL ORDER BY ukey, ord
), won AS (
    INSERT INTO __schema__.job_uniques AS k (key, job_id, expires_at)
    SELECT ukey, id, now() + make_interval(secs => ufor) FROM firsts
    ON CONFLICT (key) DO UPDATE SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at
    WHERE k.expires_at <= now() OR k.job_id = ANY(:among::uuid[])
    RETURNING job_id
), v AS (
    SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay)) AS due FROM u
    WHERE u.ukey IS NULL OR u.id IN (SELECT job_id FROM won)
), ins AS (
    INSERT INTO __schema__.jobs (id, job_type, status, priority, payload, max_retries,
                                 timeout_seconds, run_at, idempotency_key, request_hash, meta,
                                 trace_context)
    SELECT id, job_type,
           (CASE WHEN due > now() THEN 'SCHEDULED' ELSE 'PENDING' END)::__schema__.job_status,
           priority, payload::jsonb, max_retries, timeout_seconds, due, ikey, rhash, meta::jsonb,
           :trace_context::text
    FROM v
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM ins WHERE status = 'PENDING'
)
SELECT id, job_type, status::text AS status, priority, payload::text AS payload,
    result::text AS result, max_retries, timeout_seconds, retry_count, attempts, last_error,
    run_at, lease_expires_at, worker_id, cancel_requested, idempotency_key, request_hash,
    created_at, updated_at, started_at, finished_at, progress::text AS progress, meta::text AS meta
FROM ins

-- name: job_unique_holders
-- The holders of keys: the job (NULL columns when it no longer exists) by key.
SELECT k.key AS unique_key, k.job_id AS holder, j.*
FROM __schema__.job_uniques k
LEFT JOIN LATERAL (
    SELECT id, job_type, status::text AS status, priority, payload::text AS payload,
        result::text AS result, max_retries, timeout_seconds, retry_count, attempts, last_error,
        run_at, lease_expires_at, worker_id, cancel_requested, idempotency_key, request_hash,
        created_at, updated_at, started_at, finished_at, progress::text AS progress,
            meta::text AS meta
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
SELECT set_config('lock_timeout', $1, true)
