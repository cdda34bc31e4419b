-- Workflows as the REST API, the CLI, the dashboard and the gauges read them
-- (workflow_pages.py): pages newest first, the submit's Idempotency-Key, counts by status.

-- name: workflow_page
-- Newest first, keyset on the UUIDv7 id (``before``: the cursor), each with its jobs' counts.
-- Three statements, one per filter, so each reads an index range under a generic plan too
-- (``:status IS NULL OR ...`` can use no index): no filter the primary key, a status
-- ``workflows_status_id_idx``, a name (and perhaps a status) ``workflows_name_id_idx``
-- (``workflow_pages.page_statement`` picks).
SELECT workflow_id AS id, name, status, on_failure, created_at, finished_at, jobs, waiting,
       queued, running, completed, failed, cancelled
FROM __schema__.workflow_counts
WHERE workflow_id < COALESCE(:before::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
ORDER BY workflow_id DESC
LIMIT :limit

-- name: workflow_page_by_status
SELECT workflow_id AS id, name, status, on_failure, created_at, finished_at, jobs, waiting,
       queued, running, completed, failed, cancelled
FROM __schema__.workflow_counts
WHERE status = :status::text
  AND workflow_id < COALESCE(:before::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
ORDER BY status DESC, workflow_id DESC
LIMIT :limit

-- name: workflow_page_by_name
SELECT workflow_id AS id, name, status, on_failure, created_at, finished_at, jobs, waiting,
       queued, running, completed, failed, cancelled
FROM __schema__.workflow_counts
WHERE name = :name::text AND (:status::text IS NULL OR status = :status::text)
  AND workflow_id < COALESCE(:before::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
ORDER BY name DESC, workflow_id DESC
LIMIT :limit

-- name: workflow_by_idempotency_key
SELECT id, request_hash FROM __schema__.workflows WHERE idempotency_key = $1

-- name: workflow_set_idempotency_key
-- In the submit's transaction: a second submit with the key at once violates the unique index.
UPDATE __schema__.workflows SET idempotency_key = $2, request_hash = $3 WHERE id = $1

-- name: workflow_status_counts
-- The gauges' conveyor_workflows{status}, each count stopped at the cap ($1) as the jobs' are
-- (``job_counts_capped``; above it the gauge takes the planner's estimate,
-- ``workflow_count_estimate``): finished workflows stay until retention deletes them, and a
-- whole count read every one at each refresh (43 ms at 10 million jobs with a fifth of them in
-- workflows, growing with the retention window). One branch per status, a constant each: the
-- status's range of ``workflows_status_id_idx``.
SELECT 'RUNNING' AS status, count(*) AS n
    FROM (SELECT FROM __schema__.workflows WHERE status = 'RUNNING' LIMIT $1) x
UNION ALL SELECT 'COMPLETED', count(*)
    FROM (SELECT FROM __schema__.workflows WHERE status = 'COMPLETED' LIMIT $1) x
UNION ALL SELECT 'FAILED', count(*)
    FROM (SELECT FROM __schema__.workflows WHERE status = 'FAILED' LIMIT $1) x
UNION ALL SELECT 'CANCELLED', count(*)
    FROM (SELECT FROM __schema__.workflows WHERE status = 'CANCELLED' LIMIT $1) x

-- name: workflow_count_estimate
-- Planning only, as ``job_count_estimate``: the planner's estimate of the workflows in ``$1``.
EXPLAIN (FORMAT JSON) SELECT FROM __schema__.workflows WHERE status = $1::text
