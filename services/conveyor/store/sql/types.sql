-- name: job_type_register_many
INSERT INTO __schema__.job_types AS t (name, max_retries, timeout_seconds, retry_delays,
                                       concurrency, rate_limit, rate_period)
SELECT u.name, u.max_retries, u.timeout_seconds,
       CASE WHEN u.retry_delays = '' THEN NULL
            ELSE string_to_array(u.retry_delays, ',')::int4[] END,
       u.concurrency, u.rate_limit, u.rate_period
FROM unnest(:name::text[], :max_retries::int4[], :timeout_seconds::float8[],
            :retry_delays::text[], :concurrency::int4[], :rate_limit::int4[],
            :rate_period::int4[])
    AS u(name, max_retries, timeout_seconds, retry_delays, concurrency, rate_limit, rate_period)
ORDER BY u.name
ON CONFLICT (name) DO UPDATE SET
    max_retries = EXCLUDED.max_retries, timeout_seconds = EXCLUDED.timeout_seconds,
    retry_delays = EXCLUDED.retry_delays, last_seen = now(),
    -- the handler's limits, unless an operator set the type's limits at run time
    concurrency = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.concurrency
                       ELSE t.concurrency END,
    rate_limit = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.rate_limit ELSE t.rate_limit END,
    rate_period = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.rate_period
                       ELSE t.rate_period END

-- name: job_type_names
SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM __schema__.job_types

-- name: job_type_list
SELECT name, max_retries, timeout_seconds, retry_delays, first_seen, last_seen, paused,
       concurrency, rate_limit, rate_period, limits_set_at,
       (SELECT count(*) FROM __schema__.jobs j
        WHERE j.job_type = t.name AND j.status = 'IN_PROGRESS')::int AS running
FROM __schema__.job_types t ORDER BY name

-- name: type_controls
SELECT name, paused, concurrency, rate_limit, rate_period FROM __schema__.job_types
ORDER BY name

-- name: type_set_paused
UPDATE __schema__.job_types SET paused = $2 WHERE name = $1 RETURNING name

-- name: type_set_limits
-- An operator's limits: registering workers keep them from now on (``limits_set_at``).
UPDATE __schema__.job_types SET concurrency = $2, rate_limit = $3, rate_period = $4,
    limits_set_at = now(),
    recent_starts = CASE WHEN $3::int4 IS NULL THEN '{}' ELSE recent_starts END
WHERE name = $1 RETURNING name
