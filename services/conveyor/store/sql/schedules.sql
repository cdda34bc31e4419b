-- name: schedule_upsert
-- A run-time upsert (source 'api' or 'cli') replaces any schedule of that name; a handler's
-- (source 'code') replaces only a handler's and keeps its paused state. The next tick is kept
-- while the rule is unchanged.
INSERT INTO __schema__.schedules AS s (name, job_type, payload, cron, every_seconds, timezone,
                                       priority, enabled, catch_up, source, next_run_at)
VALUES (:name, :job_type, :payload::jsonb, :cron, :every_seconds, :timezone, :priority, :enabled,
        :catch_up, :source, :next_run_at)
ON CONFLICT (name) DO UPDATE SET
    job_type = EXCLUDED.job_type, payload = EXCLUDED.payload, cron = EXCLUDED.cron,
    every_seconds = EXCLUDED.every_seconds, timezone = EXCLUDED.timezone,
    priority = EXCLUDED.priority, catch_up = EXCLUDED.catch_up, source = EXCLUDED.source,
    enabled = CASE WHEN EXCLUDED.source = 'code' THEN s.enabled ELSE EXCLUDED.enabled END,
    next_run_at = CASE
        WHEN NOT (CASE WHEN EXCLUDED.source = 'code' THEN s.enabled ELSE EXCLUDED.enabled END)
        THEN NULL
        WHEN s.cron IS NOT DISTINCT FROM EXCLUDED.cron
             AND s.every_seconds IS NOT DISTINCT FROM EXCLUDED.every_seconds
             AND s.timezone = EXCLUDED.timezone AND s.enabled AND s.next_run_at IS NOT NULL
        THEN s.next_run_at ELSE EXCLUDED.next_run_at END,
    updated_at = now()
WHERE EXCLUDED.source <> 'code' OR s.source = 'code'
RETURNING name, job_type, payload::text AS payload, cron, every_seconds, timezone, priority,
    enabled, catch_up, source, next_run_at, last_tick_at, last_job_id, created_at, updated_at,
    (xmax = 0) AS created

-- name: schedule_get
SELECT name, job_type, payload::text AS payload, cron, every_seconds, timezone, priority,
    enabled, catch_up, source, next_run_at, last_tick_at, last_job_id, created_at, updated_at
FROM __schema__.schedules WHERE name = $1

-- name: schedule_list
SELECT name, job_type, payload::text AS payload, cron, every_seconds, timezone, priority,
    enabled, catch_up, source, next_run_at, last_tick_at, last_job_id, created_at, updated_at
FROM __schema__.schedules ORDER BY name

-- name: schedule_delete
DELETE FROM __schema__.schedules WHERE name = $1 RETURNING name

-- name: schedule_set_enabled
-- A paused schedule has no next tick; resume plans from now ($3): ticks that fell while the
-- schedule was paused never run (they were not missed, they were paused).
UPDATE __schema__.schedules SET
    enabled = $2,
    next_run_at = CASE WHEN NOT $2 THEN NULL WHEN NOT enabled THEN $3 ELSE next_run_at END,
    updated_at = now()
WHERE name = $1
RETURNING name, job_type, payload::text AS payload, cron, every_seconds, timezone, priority,
    enabled, catch_up, source, next_run_at, last_tick_at, last_job_id, created_at, updated_at

-- name: schedule_take_due
SELECT name, job_type, payload::text AS payload, cron, every_seconds, timezone, priority,
    enabled, catch_up, source, next_run_at, last_tick_at, last_job_id, created_at, updated_at
FROM __schema__.schedules
WHERE enabled AND (next_run_at <= $1 OR next_run_at IS NULL)
ORDER BY next_run_at NULLS FIRST
LIMIT $2
FOR UPDATE SKIP LOCKED

-- name: schedule_advance
UPDATE __schema__.schedules s SET
    next_run_at = u.next_run_at,
    last_tick_at = COALESCE(u.last_tick_at, s.last_tick_at),
    last_job_id = COALESCE(u.last_job_id, s.last_job_id),
    updated_at = now()
FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::uuid[])
    AS u(name, next_run_at, last_tick_at, last_job_id)
WHERE s.name = u.name

-- name: db_clock
SELECT clock_timestamp()
