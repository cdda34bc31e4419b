-- name: job_progress_many
-- Fenced like every write of an attempt: a stale attempt's report changes nothing. The status
-- test is a CASE, not ``j.status = 'IN_PROGRESS'`` (see RUNNING in attempts.py): that would
-- imply ``jobs_lease_idx``'s predicate and invite a scan of that whole index.
UPDATE __schema__.jobs j SET
    progress = jsonb_build_object('percent', u.percent, 'message', u.message,
                                  'updated_at', now())
FROM unnest($1::uuid[], $2::int4[], $3::float8[], $4::text[])
    AS u(id, attempt, percent, message)
WHERE j.id = u.id AND j.attempts = u.attempt
  AND CASE j.status WHEN 'IN_PROGRESS' THEN true ELSE false END
RETURNING j.id

-- name: job_completed_among
-- In the completing transaction, after ``job_complete_many``: which of the attempts it wrote
-- ended COMPLETED (not CANCELLED by a cancel requested while they ran).
SELECT j.id FROM __schema__.jobs j
JOIN unnest($1::uuid[], $2::int4[]) AS u(id, attempt) ON j.id = u.id
WHERE j.attempts = u.attempt AND j.status = 'COMPLETED'
