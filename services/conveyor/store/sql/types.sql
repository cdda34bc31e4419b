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

-- name: partition_since fragment
-- Since when a key's jobs ``x`` wait for admission: the oldest of those admission could take
-- (due: no ``run_at`` ahead; no dependency pending), each counted from its submit or from its
-- ``run_at`` (a retry's or a delayed job's due time) when that is later. NULL: none.
min(greatest(x.created_at, x.run_at))
    FILTER (WHERE COALESCE(x.run_at <= now(), true) AND COALESCE(x.deps_pending, 0) = 0)

-- name: partition_columns fragment
-- A key's view (GET /types/{type}/partitions) from ``v`` (its counts, ``since``, and its
-- override row's ``concurrency`` and ``paused``) and its type ``t``: the key's limit as
-- ``admit`` applies it, the operator's override, else the type's ``partition_concurrency``
-- (NULL: none), and 1 for an ordered type whatever they say.
v.key, v.waiting, v.admitted, v.running, v.since,
round(extract(epoch FROM now() - v.since), 3)::float8 AS oldest_wait_seconds,
v.concurrency, v.paused,
least(COALESCE(v.concurrency, t.partition_concurrency),
      CASE WHEN t.ordered IS NOT NULL THEN 1 END) AS key_limit

-- name: partition_page
-- The keys of a type (GET /types/{type}/partitions): those with jobs WAITING, PENDING
-- (admitted) or IN_PROGRESS, and those with an operator's override (a concurrency or a pause,
-- jobs or not, so that it can be seen and removed); not '' (a type limited as a whole). Oldest
-- wait first (keys with no job waiting for admission last), then by key; a keyset page after
-- (``:after_since``, ``:after_key``) (``:after_key`` NULL: the first page). Each page counts every
-- key of the type: ``jobs_admit_idx`` for the waiting jobs (the wait needs their rows),
-- ``jobs_admitted_idx`` for the admitted and running ones (index only): about 50 ms on two idle
-- cores at 10,000 keys of 10 waiting jobs each (``bench/scale.py``). Beside few other rows (a
-- table of little but these keys' waiting jobs) the planner rightly reads the table whole.
WITH k AS (
    SELECT x.partition_key AS key, count(*)::int AS waiting, 0 AS admitted, 0 AS running,
           {{partition_since}} AS since, NULL::int AS concurrency, false AS paused
    FROM __schema__.jobs x
    WHERE x.job_type = :job_type AND x.status = 'WAITING' AND x.partition_key IS NOT NULL
      AND x.partition_key <> ''
    GROUP BY x.partition_key
    UNION ALL
    SELECT x.partition_key, 0, count(*) FILTER (WHERE x.status = 'PENDING')::int,
           count(*) FILTER (WHERE x.status = 'IN_PROGRESS')::int, NULL, NULL, false
    FROM __schema__.jobs x
    WHERE x.job_type = :job_type AND x.status IN ('PENDING', 'IN_PROGRESS')
      AND x.partition_key IS NOT NULL AND x.partition_key <> ''
    GROUP BY x.partition_key
    UNION ALL
    SELECT p.key, 0, 0, 0, NULL, p.concurrency, p.paused FROM __schema__.partitions p
    WHERE p.job_type = :job_type AND p.key <> '' AND (p.concurrency IS NOT NULL OR p.paused)
), v AS (
    SELECT k.key, sum(k.waiting)::int AS waiting, sum(k.admitted)::int AS admitted,
           sum(k.running)::int AS running, min(k.since) AS since,
           min(k.concurrency) AS concurrency, bool_or(k.paused) AS paused
    FROM k GROUP BY k.key
)
SELECT {{partition_columns}}
FROM v CROSS JOIN __schema__.job_types t
WHERE t.name = :job_type
  AND (:after_key::text IS NULL
       OR (:after_since::timestamptz IS NULL AND v.since IS NULL AND v.key > :after_key)
       OR (:after_since IS NOT NULL
           AND (v.since IS NULL OR v.since > :after_since
                OR (v.since = :after_since AND v.key > :after_key))))
ORDER BY v.since NULLS LAST, v.key
LIMIT :limit

-- name: partition_get
-- One key's view, as ``partition_page`` shows it; no row when the type is unknown.
SELECT {{partition_columns}}
FROM __schema__.job_types t
LEFT JOIN __schema__.partitions p ON p.job_type = t.name AND p.key = :key
CROSS JOIN LATERAL (
    SELECT :key AS key, count(*)::int AS waiting, {{partition_since}} AS since,
           p.concurrency, COALESCE(p.paused, false) AS paused
    FROM __schema__.jobs x
    WHERE x.job_type = t.name AND x.status = 'WAITING' AND x.partition_key = :key
) w
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE x.status = 'PENDING')::int AS admitted,
           count(*) FILTER (WHERE x.status = 'IN_PROGRESS')::int AS running
    FROM __schema__.jobs x
    WHERE x.job_type = t.name AND x.status IN ('PENDING', 'IN_PROGRESS')
      AND x.partition_key = :key
) a
CROSS JOIN LATERAL (
    SELECT w.key, w.waiting, a.admitted, a.running, w.since, w.concurrency, w.paused
) v
WHERE t.name = :job_type

-- name: partition_set
-- An operator's settings of one key (PUT /types/{type}/partitions/{key}), kept until removed:
-- its concurrency when ``:set_concurrency`` (``:concurrency`` NULL: none, the type's
-- ``partition_concurrency`` applies), its pause unless ``:paused`` is NULL; the admission
-- duty's next pass (0.05 s) applies it. Returns whether the row is left holding nothing (no
-- override, no ordered commit counter ``seq``), for ``partition_prune``; no row when the type
-- is unknown.
WITH t AS (
    SELECT y.name FROM __schema__.job_types y WHERE y.name = :job_type
), up AS (
    INSERT INTO __schema__.partitions AS p (job_type, key, concurrency, paused)
    SELECT t.name, :key::text, CASE WHEN :set_concurrency::boolean THEN :concurrency::int END,
           COALESCE(:paused::boolean, false)
    FROM t
    ON CONFLICT (job_type, key) DO UPDATE SET
        concurrency = CASE WHEN :set_concurrency THEN EXCLUDED.concurrency
                           ELSE p.concurrency END,
        paused = COALESCE(:paused, p.paused),
        updated_at = now()
    RETURNING p.job_type, p.concurrency IS NULL AND NOT p.paused AND p.seq = 0 AS empty
)
SELECT up.empty FROM up

-- name: partition_prune
-- A key's row once it holds nothing: no override, and no ordered commit counter (``seq`` > 0
-- is never lost: the places of the key's next jobs follow it). After ``partition_set``, in
-- its transaction (which holds the row's lock).
DELETE FROM __schema__.partitions
WHERE job_type = $1 AND key = $2 AND concurrency IS NULL AND NOT paused AND seq = 0
