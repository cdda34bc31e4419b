-- name: job_type_register_many
-- The handlers' settings; an operator's limits (``limits_set_at``) are kept.
INSERT INTO __schema__.job_types AS t (name, max_retries, timeout_seconds, retry_delays,
                                       concurrency, rate_limit, rate_period, partition_by,
                                       partition_concurrency, partition_rate_limit,
                                       partition_rate_period, ordered)
SELECT u.name, u.max_retries, u.timeout_seconds,
       CASE WHEN u.retry_delays = '' THEN NULL
            ELSE string_to_array(u.retry_delays, ',')::int4[] END,
       u.concurrency, u.rate_limit, u.rate_period,
       NULLIF(ARRAY(SELECT jsonb_array_elements_text(u.partition_by::jsonb)), '{}'),
       u.partition_concurrency, u.partition_rate_limit, u.partition_rate_period, u.ordered
FROM unnest(:name::text[], :max_retries::int4[], :timeout_seconds::float8[],
            :retry_delays::text[], :concurrency::int4[], :rate_limit::int4[],
            :rate_period::int4[], :partition_by::text[], :partition_concurrency::int4[],
            :partition_rate_limit::int4[], :partition_rate_period::int4[], :ordered::text[])
    AS u(name, max_retries, timeout_seconds, retry_delays, concurrency, rate_limit, rate_period,
         partition_by, partition_concurrency, partition_rate_limit, partition_rate_period,
         ordered)
ORDER BY u.name
ON CONFLICT (name) DO UPDATE SET
    max_retries = EXCLUDED.max_retries, timeout_seconds = EXCLUDED.timeout_seconds,
    retry_delays = EXCLUDED.retry_delays, last_seen = now(),
    concurrency = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.concurrency
                       ELSE t.concurrency END,
    rate_limit = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.rate_limit ELSE t.rate_limit END,
    rate_period = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.rate_period
                       ELSE t.rate_period END,
    partition_by = EXCLUDED.partition_by,
    partition_concurrency = EXCLUDED.partition_concurrency,
    partition_rate_limit = EXCLUDED.partition_rate_limit,
    partition_rate_period = EXCLUDED.partition_rate_period, ordered = EXCLUDED.ordered

-- name: job_type_names
SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM __schema__.job_types

-- name: job_type_list
SELECT name, max_retries, timeout_seconds, retry_delays, first_seen, last_seen, paused,
       concurrency, rate_limit, rate_period, limits_set_at, partition_by,
       partition_concurrency, partition_rate_limit, partition_rate_period, ordered,
       (SELECT count(*) FROM __schema__.jobs j
        WHERE j.job_type = t.name AND j.status = 'IN_PROGRESS')::int AS running
FROM __schema__.job_types t ORDER BY name

-- name: type_controls
SELECT name, paused FROM __schema__.job_types ORDER BY name

-- name: type_set_paused
UPDATE __schema__.job_types SET paused = $2 WHERE name = $1 RETURNING name

-- name: type_set_limits
-- An operator's limits: registering workers keep them from now on (``limits_set_at``).
UPDATE __schema__.job_types SET concurrency = $2, rate_limit = $3, rate_period = $4,
    limits_set_at = now()
WHERE name = $1 RETURNING name
