-- name: testing_make_due
-- conveyor.testing's drain does not wait for timers: SCHEDULED jobs of the types that are due
-- (all of them with $2) become PENDING. Nothing is published: the drain claims the rows itself.
UPDATE __schema__.jobs SET
    status = 'PENDING'::__schema__.job_status,
    run_at = least(run_at, now()),
    updated_at = now()
WHERE array_position($1::text[], job_type) IS NOT NULL
  AND status = 'SCHEDULED' AND ($2 OR run_at <= now())

-- name: testing_skip_retry_delay
-- RETRYING jobs of the types waiting out their retry delay are due now (and so are the retries
-- waiting for admission).
UPDATE __schema__.jobs SET run_at = now(), updated_at = now()
WHERE array_position($1::text[], job_type) IS NOT NULL AND run_at > now()
  AND (status = 'RETRYING' OR (status = 'WAITING' AND partition_key IS NOT NULL
                               AND retry_count > 0))

-- name: testing_admit_scheduled
-- Jobs of the types waiting for admission and scheduled later are due now.
UPDATE __schema__.jobs SET run_at = now()
WHERE array_position($1::text[], job_type) IS NOT NULL
  AND status = 'WAITING' AND partition_key IS NOT NULL AND run_at > now()

-- name: testing_admit
-- Each type's admission pass, with no window (the drain claims the rows itself).
SELECT __schema__.admit(t, 2147483647) FROM unnest($1::text[]) t

-- name: testing_due_ids
-- The claimable jobs of the types (as job_claim_many tests them), in the order workers favour:
-- higher priority first, then the oldest.
SELECT id FROM __schema__.jobs j
WHERE array_position($1::text[], job_type) IS NOT NULL
  AND {{job_claimable}}
ORDER BY priority DESC, COALESCE(run_at, created_at), id
LIMIT $2

-- name: testing_waiting
-- Waiting jobs (PENDING, SCHEDULED, RETRYING) of a type, or of all types; payload and meta
-- match by containment (the keys given, with those values); unique_key matches the key a
-- unique job holds (unique_key= of a submit, stored as <type>/key/<key>).
SELECT {{job_row}}
FROM __schema__.jobs j
WHERE ($1::text IS NULL OR j.job_type = $1)
  AND j.status IN ('PENDING', 'SCHEDULED', 'RETRYING')
  AND ($2::jsonb IS NULL OR j.payload @> $2::jsonb)
  AND ($3::jsonb IS NULL OR COALESCE(j.meta, '{}'::jsonb) @> $3::jsonb)
  AND ($4::text IS NULL OR EXISTS (SELECT 1 FROM __schema__.job_uniques u
                                   WHERE u.key = j.job_type || '/key/' || $4
                                     AND u.job_id = j.id))
ORDER BY j.created_at, j.id

-- name: testing_drop_schema
-- The test plugin's per-session schema, and everything in it.
DROP SCHEMA IF EXISTS __schema__ CASCADE
