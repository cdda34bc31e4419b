-- name: job_backlog
SELECT type, status::text AS status, count, oldest FROM __schema__.backlog

-- name: job_counts_capped
-- The backlog view's skip scan over the types, with each count stopped at the cap ($1): one
-- branch per status of the ``backlog`` view (every one but COMPLETED and CANCELLED:
-- ``stats.COUNTED_STATUSES``), the status a constant in each. As a parameter (a loop over the
-- statuses) the planner must guess a pair's rows, 1/n_distinct of the type's, and when the
-- statistics have seen no PENDING or running job (a quiet install analysed at night: four
-- statuses) or are older than the table (a bulk load), the guess is large enough that "a
-- sequential scan, or a walk of the primary key, stopped after $1 matching rows" looks cheap:
-- it reads the whole table for every empty pair. A constant
-- is estimated from the statistics (a status they never saw: one row), so the pair's range of
-- the (type, status, id) index is the plan. ``ORDER BY j.id`` does not pin it: the equalities
-- make (type, status) redundant in the ordering, and the primary key supplies ``id`` order.
WITH RECURSIVE t(job_type) AS (
    SELECT min(job_type) FROM __schema__.jobs
    UNION ALL
    SELECT (SELECT min(j.job_type) FROM __schema__.jobs j WHERE j.job_type > t.job_type)
    FROM t WHERE t.job_type IS NOT NULL
)
SELECT t.job_type AS type, c.status, c.n
FROM t
CROSS JOIN LATERAL (
    SELECT 'WAITING'::text AS status, count(*) AS n
        FROM (SELECT FROM __schema__.jobs j
              WHERE j.job_type = t.job_type AND j.status = 'WAITING' LIMIT $1) x
    UNION ALL SELECT 'PENDING'::text AS status, count(*) AS n
        FROM (SELECT FROM __schema__.jobs j
              WHERE j.job_type = t.job_type AND j.status = 'PENDING' LIMIT $1) x
    UNION ALL SELECT 'SCHEDULED'::text AS status, count(*) AS n
        FROM (SELECT FROM __schema__.jobs j
              WHERE j.job_type = t.job_type AND j.status = 'SCHEDULED' LIMIT $1) x
    UNION ALL SELECT 'IN_PROGRESS'::text AS status, count(*) AS n
        FROM (SELECT FROM __schema__.jobs j
              WHERE j.job_type = t.job_type AND j.status = 'IN_PROGRESS' LIMIT $1) x
    UNION ALL SELECT 'RETRYING'::text AS status, count(*) AS n
        FROM (SELECT FROM __schema__.jobs j
              WHERE j.job_type = t.job_type AND j.status = 'RETRYING' LIMIT $1) x
    UNION ALL SELECT 'FAILED'::text AS status, count(*) AS n
        FROM (SELECT FROM __schema__.jobs j
              WHERE j.job_type = t.job_type AND j.status = 'FAILED' LIMIT $1) x
) c
WHERE t.job_type IS NOT NULL AND c.n > 0

-- name: job_count_estimate
-- Planning only (EXPLAIN without ANALYZE runs nothing): the bound values are planned as
-- constants, so the estimate is the one of this type and status.
EXPLAIN (FORMAT JSON) SELECT FROM __schema__.jobs
WHERE job_type = $1 AND status = $2::__schema__.job_status

-- name: outbox_stats
SELECT count(*) AS n, COALESCE(extract(epoch FROM now() - min(created_at)), 0)::float8 AS lag
FROM __schema__.job_outbox

-- name: job_stuck_count
-- Running jobs whose lease expired and that maintenance has not put back yet (the ``stuck_jobs``
-- view: a range of ``jobs_lease_idx``); above 0 for minutes means lease recovery is not running.
SELECT count(*) AS n FROM __schema__.stuck_jobs

-- name: job_overview_hour
SELECT job_type AS type,
       count(*) FILTER (WHERE outcome = 'completed') AS completed,
       count(*) FILTER (WHERE outcome = 'failed') AS failed,
       count(*) FILTER (WHERE outcome IN ('retry', 'lease_expired')) AS retried,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_seconds) AS wait_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_seconds) AS wait_p95
FROM __schema__.job_attempts
WHERE finished_at > now() - interval '1 hour'
GROUP BY job_type ORDER BY job_type

-- name: job_page
-- Newest first; ``before``/``since``: id bounds (keyset cursor, time window as UUIDv7 bounds).
-- Without a filter the primary key serves the order. With a type and/or a status, each (type,
-- status) range of ``jobs_type_status_id_idx`` is read newest first, at most ``limit`` rows
-- each, and the ranges are merged: a rare type or status never walks the whole primary key. The
-- bounds are COALESCEd to the extreme UUIDs rather than ``before IS NULL OR id < before``: a
-- generic plan (a
-- prepared statement's sixth execution on) then still seeks the cursor in the index instead of
-- filtering every newer row on the way to it. The ranges yield ids only (index-only), and the
-- page's rows are then looked up by id: read whole, a range's rows cost a heap fetch each, and
-- when the statistics had seen no backlog the planner preferred walking the primary key back
-- from the cursor, filtering type and status, to find them (a rare pair: half the table).
SELECT {{job_row}}, ARRAY(SELECT d.depends_on FROM __schema__.job_dependencies d
                       WHERE d.job_id = jobs.id ORDER BY d.depends_on) AS depends_on
FROM __schema__.jobs
WHERE id < COALESCE(:before::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
  AND id >= COALESCE(:since::uuid, '00000000-0000-0000-0000-000000000000')
  AND :job_type::text IS NULL AND :status::text IS NULL
ORDER BY id DESC
LIMIT :limit

-- name: job_page_filtered
-- job_page with a type and/or a status (see there).
WITH RECURSIVE t(job_type) AS (
    SELECT COALESCE(:job_type::text, min(job_type)) FROM __schema__.jobs
    UNION ALL
    SELECT (SELECT min(j.job_type) FROM __schema__.jobs j WHERE j.job_type > t.job_type)
    FROM t WHERE t.job_type IS NOT NULL AND :job_type IS NULL
), page AS (
    SELECT x.id FROM t
    CROSS JOIN unnest(CASE WHEN :status::text IS NULL THEN enum_range(NULL::__schema__.job_status)
                           ELSE ARRAY[:status::__schema__.job_status] END) AS st(status)
    CROSS JOIN LATERAL (
        SELECT id FROM __schema__.jobs
        WHERE job_type = t.job_type AND status = st.status
          AND id < COALESCE(:before::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
          AND id >= COALESCE(:since::uuid, '00000000-0000-0000-0000-000000000000')
        ORDER BY id DESC LIMIT :limit
    ) x
    WHERE t.job_type IS NOT NULL
    ORDER BY x.id DESC
    LIMIT :limit
)
SELECT {{job_row}}, ARRAY(SELECT d.depends_on FROM __schema__.job_dependencies d
                       WHERE d.job_id = jobs.id ORDER BY d.depends_on) AS depends_on
FROM __schema__.jobs
WHERE id = ANY(ARRAY(SELECT id FROM page))
ORDER BY id DESC

-- name: job_dead_groups
-- Dead letters grouped by the error's first line (the exception and its message, without the
-- traceback), cut at 160 characters; job_dead_count, job_redrive_dead and job_purge_dead take
-- such a group ($1 type, $2 error key or NULL for all, $3 at most).
WITH RECURSIVE t(job_type) AS (
    SELECT min(job_type) FROM __schema__.jobs
    UNION ALL
    SELECT (SELECT min(j.job_type) FROM __schema__.jobs j WHERE j.job_type > t.job_type)
    FROM t WHERE t.job_type IS NOT NULL
)
SELECT t.job_type AS type, g.error, g.count, g.last_failed
FROM t CROSS JOIN LATERAL (
    SELECT left(split_part(COALESCE(last_error, ''), E'\n', 1), 160) AS error,
           count(*) AS count, max(finished_at) AS last_failed
    FROM __schema__.jobs j WHERE j.job_type = t.job_type AND j.status = 'FAILED'
    GROUP BY 1
) g
WHERE t.job_type IS NOT NULL
ORDER BY g.count DESC, t.job_type, g.error
LIMIT 500

-- name: job_dead_count
SELECT count(*) FROM __schema__.jobs
WHERE job_type = $1 AND status = 'FAILED'
  AND ($2::text IS NULL OR left(split_part(COALESCE(last_error, ''), E'\n', 1), 160) = $2)

-- name: job_redrive_dead
-- Redrive by filter through the store: FAILED → PENDING with fresh retries and an outbox row.
-- Their copies in the dead-letter queue stay; `conveyor dlq` drops a copy whose job is no longer
-- FAILED.
WITH d AS (
    SELECT id FROM __schema__.jobs
    WHERE job_type = $1 AND status = 'FAILED'
      AND ($2::text IS NULL OR left(split_part(COALESCE(last_error, ''), E'\n', 1), 160) = $2)
    LIMIT $3 FOR UPDATE SKIP LOCKED
), r AS (
    UPDATE __schema__.jobs j SET status = 'PENDING', retry_count = 0, cancel_requested = false,
        result = NULL, finished_at = NULL, run_at = NULL, lease_expires_at = NULL,
        updated_at = now()
    FROM d WHERE j.id = d.id
    RETURNING j.id, j.job_type, j.priority, j.status
), ob AS (  -- a workflow job with an unmet dependency stays WAITING: no message
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM r WHERE status = 'PENDING'
)
SELECT count(*) FROM r

-- name: job_purge_dead
WITH d AS (
    SELECT id FROM __schema__.jobs
    WHERE job_type = $1 AND status = 'FAILED'
      AND ($2::text IS NULL OR left(split_part(COALESCE(last_error, ''), E'\n', 1), 160) = $2)
    LIMIT $3 FOR UPDATE SKIP LOCKED
), a AS (
    DELETE FROM __schema__.job_attempts a USING d WHERE a.job_id = d.id
)
DELETE FROM __schema__.jobs j USING d WHERE j.id = d.id
