-- name: job_backlog
SELECT type, status::text AS status, count, oldest FROM __schema__.backlog

-- name: job_counts_capped
-- The backlog view's skip scan over the types, with each count stopped at the cap ($1): one
-- branch per status of the ``backlog`` view (every one but COMPLETED and CANCELLED:
-- ``stats.COUNTED_STATUSES``), the status a constant in each. As a parameter (a loop over the
-- statuses) the planner had to guess a pair's rows, 1/n_distinct of the type's, and when the
-- statistics had seen no PENDING or running job (a quiet install analysed at night: four
-- statuses) or were older than the table (a bulk load), the guess was large enough that "a
-- sequential scan, or a walk of the primary key, stopped after $1 matching rows" looked cheap:
-- it read the whole table for every empty pair, ~8 s a refresh at 10 million rows. A constant
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
