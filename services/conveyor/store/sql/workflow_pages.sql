-- Workflows as the REST API, the CLI, the dashboard and the gauges read them
-- (workflow_pages.py): pages newest first, the submit's Idempotency-Key, counts by status.

-- name: workflow_page
-- Newest first, keyset on the UUIDv7 id (``before``: the cursor), each with its jobs' counts;
-- ``status`` and ``name`` filter when given.
SELECT workflow_id AS id, name, status, on_failure, created_at, finished_at, jobs, waiting,
       queued, running, completed, failed, cancelled
FROM __schema__.workflow_counts
WHERE workflow_id < COALESCE(:before::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
  AND (:status::text IS NULL OR status = :status::text)
  AND (:name::text IS NULL OR name = :name::text)
ORDER BY workflow_id DESC
LIMIT :limit

-- name: workflow_by_idempotency_key
SELECT id, request_hash FROM __schema__.workflows WHERE idempotency_key = $1

-- name: workflow_set_idempotency_key
-- In the submit's transaction: a second submit with the key at once violates the unique index.
UPDATE __schema__.workflows SET idempotency_key = $2, request_hash = $3 WHERE id = $1

-- name: workflow_status_counts
-- The gauges' conveyor_workflows{status}: finished workflows stay until retention deletes them.
SELECT status, count(*) AS n FROM __schema__.workflows GROUP BY status
