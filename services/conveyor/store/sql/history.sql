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
