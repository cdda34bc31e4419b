-- Operator SQL: the supported writes as functions, and views to read the system by. Both
-- functions are SECURITY INVOKER: a role needs the same rights as for the UPDATE itself.

-- What an operator means by "set it back to PENDING", done whole: a FAILED or CANCELLED job is
-- redriven as POST /jobs/{id}/retry does (fresh retries, back to SCHEDULED when it never ran
-- and its run_at is ahead); a PENDING or RETRYING job is published now, its status kept (a
-- hold or a pen's remaining delay dropped), and a SCHEDULED one made PENDING now. Either way
-- with an outbox row and a NOTIFY, so the relay publishes it at once. An IN_PROGRESS job is
-- refused (a re-run would fence the running attempt's result away: cancel it instead) and so
-- is a COMPLETED one (a re-run would replace its result: submit a new job). Returns the new
-- status, NULL for no such job.
CREATE FUNCTION __schema__.retry_job(job_id uuid) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    j __schema__.jobs%ROWTYPE;
    new_status text;
BEGIN
    SELECT * INTO j FROM __schema__.jobs WHERE id = job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF j.status = 'IN_PROGRESS' THEN
        RAISE EXCEPTION 'job % is IN_PROGRESS: a re-run now would throw away the running '
            'attempt''s result; cancel it with __schema__.cancel_job(), or let it finish', job_id;
    ELSIF j.status = 'COMPLETED' THEN
        RAISE EXCEPTION 'job % is COMPLETED: a re-run would replace its result; submit a new '
            'job instead', job_id;
    ELSIF j.status = 'WAITING' THEN
        -- released when its dependencies complete, or admitted: a retry's delay is skipped
        UPDATE __schema__.jobs SET run_at = now(), updated_at = now()
        WHERE id = job_id AND partition_key IS NOT NULL AND COALESCE(deps_pending, 0) = 0
          AND run_at > now();
        RETURN 'WAITING';
    END IF;
    new_status := CASE WHEN j.status = 'CANCELLED' AND j.attempts = 0 AND j.run_at > now()
                       THEN 'SCHEDULED' WHEN j.status = 'RETRYING' THEN 'RETRYING'
                       ELSE 'PENDING' END;
    UPDATE __schema__.jobs SET
        status = new_status::__schema__.job_status,
        run_at = CASE WHEN new_status = 'SCHEDULED' THEN run_at
                      WHEN j.status IN ('FAILED', 'CANCELLED') THEN NULL
                      WHEN run_at > now() THEN now() ELSE run_at END,
        retry_count = CASE WHEN j.status IN ('FAILED', 'CANCELLED') THEN 0 ELSE retry_count END,
        cancel_requested = false,
        result = NULL, finished_at = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE id = job_id
    RETURNING status::text INTO new_status;
    IF new_status IS NULL THEN
        RETURN j.status;  -- a workflow job whose dependency failed: kept until that is retried
    END IF;
    IF new_status NOT IN ('SCHEDULED', 'WAITING') AND NOT EXISTS (
        SELECT 1 FROM __schema__.job_outbox o WHERE o.job_id = j.id AND o.destination = 'work'
    ) THEN
        INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
        VALUES (j.id, j.job_type, j.priority);
        PERFORM pg_notify('__schema___outbox', '');
    END IF;
    RETURN new_status;
END
$fn$;

-- POST /jobs/{id}/cancel: a waiting job is CANCELLED; a running one is asked to stop (its status
-- stays IN_PROGRESS until its attempt ends); a FAILED job of an ordered type is CANCELLED too,
-- which lets its key go on. Returns the status after the call, NULL when the job is finished
-- or missing. A waiting job may be *held* (a lease on a PENDING/RETRYING job in a worker's
-- inbox: maintenance.sql's ``job_unheld``): the hold goes, so a redrive leaves the reconciler
-- nothing to wait for; only a SCHEDULED job keeps its ``run_at`` (a redrive brings a cancelled
-- job that never ran back SCHEDULED only while that is ahead).
CREATE FUNCTION __schema__.cancel_job(job_id uuid) RETURNS text LANGUAGE sql AS $fn$
UPDATE __schema__.jobs SET
    status = (CASE WHEN status = 'IN_PROGRESS' THEN 'IN_PROGRESS' ELSE 'CANCELLED' END)
             ::__schema__.job_status,
    cancel_requested = true,
    finished_at = CASE WHEN status = 'IN_PROGRESS' THEN NULL ELSE now() END,
    lease_expires_at = CASE WHEN status = 'IN_PROGRESS' THEN lease_expires_at END,
    run_at = CASE WHEN status IN ('SCHEDULED', 'IN_PROGRESS', 'WAITING') THEN run_at END,
    debounce_key = NULL,  -- a redriven job is no submit to fold into
    updated_at = now()
WHERE id = job_id AND (status IN ('WAITING', 'PENDING', 'SCHEDULED', 'RETRYING', 'IN_PROGRESS')
                       OR (status = 'FAILED' AND admit_seq IS NOT NULL))
RETURNING status::text
$fn$;

-- Each type's jobs by status: the count and the oldest. The types are found by a skip scan of
-- jobs_type_status_id_idx (one probe per type), each count from the same index.
CREATE VIEW __schema__.backlog AS
WITH RECURSIVE t(job_type) AS (
    SELECT min(job_type) FROM __schema__.jobs
    UNION ALL
    SELECT (SELECT min(j.job_type) FROM __schema__.jobs j WHERE j.job_type > t.job_type)
    FROM t WHERE t.job_type IS NOT NULL
)
SELECT t.job_type AS type, st.status, c.count, o.oldest
FROM t
CROSS JOIN unnest(ARRAY['WAITING', 'SCHEDULED', 'PENDING', 'RETRYING', 'IN_PROGRESS', 'FAILED']
                  ::__schema__.job_status[]) AS st(status)
CROSS JOIN LATERAL (SELECT count(*) AS count FROM __schema__.jobs j
                    WHERE j.job_type = t.job_type AND j.status = st.status) c
CROSS JOIN LATERAL (SELECT j.created_at AS oldest FROM __schema__.jobs j
                    WHERE j.job_type = t.job_type AND j.status = st.status
                    ORDER BY j.id LIMIT 1) o
WHERE t.job_type IS NOT NULL;

-- Running jobs whose lease ran out, or that have none (set by hand, never claimed): lease
-- recovery puts them back.
CREATE VIEW __schema__.stuck_jobs AS
SELECT id, job_type AS type, worker_id, attempts AS attempt, started_at, lease_expires_at,
       now() - COALESCE(lease_expires_at, updated_at) AS overdue
FROM __schema__.jobs
WHERE status = 'IN_PROGRESS' AND (lease_expires_at < now() OR lease_expires_at IS NULL);

-- The last hour's failures by cause: type, error class and the error's first line (an error is
-- "Type: message" then the traceback, so the whole text would split one cause raised from two
-- places into rows of one each), with one recent attempt's job to look at. A Retry snooze (an
-- attempt that asked to run later without using up a retry: its error is the one line
-- "Retry: <reason>") is not a failure.
CREATE VIEW __schema__.recent_failures AS
SELECT job_type AS type, split_part(error, E'\n', 1) AS error, count(*) AS count,
       max(finished_at) AS last_seen,
       substring(split_part(error, E'\n', 1) FROM '^([A-Za-z_][A-Za-z0-9_.]*): ') AS error_class,
       (array_agg(job_id ORDER BY finished_at DESC))[1] AS last_job_id
FROM __schema__.job_attempts
WHERE finished_at > now() - interval '1 hour' AND outcome IN ('retry', 'failed', 'lease_expired')
  AND NOT (outcome = 'retry' AND error LIKE 'Retry: %' AND strpos(error, E'\n') = 0)
GROUP BY 1, 2;

CREATE VIEW __schema__.throughput AS
SELECT date_trunc('minute', finished_at) AS minute, job_type AS type,
       count(*) FILTER (WHERE outcome = 'completed') AS completed,
       count(*) FILTER (WHERE outcome = 'failed') AS failed
FROM __schema__.job_attempts
WHERE finished_at > now() - interval '1 hour'
GROUP BY 1, 2;

-- Each workflow with its jobs counted by state; running_workflows: the RUNNING ones.
CREATE VIEW __schema__.workflow_counts AS
SELECT w.id AS workflow_id, w.name, w.status, w.on_failure, w.created_at, w.finished_at,
       now() - w.created_at AS age, c.*
FROM __schema__.workflows w CROSS JOIN LATERAL (
    SELECT count(*) AS jobs,
           count(*) FILTER (WHERE j.status = 'WAITING') AS waiting,
           count(*) FILTER (WHERE j.status IN ('PENDING', 'SCHEDULED', 'RETRYING')) AS queued,
           count(*) FILTER (WHERE j.status = 'IN_PROGRESS') AS running,
           count(*) FILTER (WHERE j.status = 'COMPLETED') AS completed,
           count(*) FILTER (WHERE j.status = 'FAILED') AS failed,
           count(*) FILTER (WHERE j.status = 'CANCELLED') AS cancelled
    FROM __schema__.jobs j WHERE j.workflow_id = w.id) c;

CREATE VIEW __schema__.running_workflows AS
SELECT * FROM __schema__.workflow_counts WHERE status = 'RUNNING';

-- Each WAITING workflow job and what it still waits for.
CREATE VIEW __schema__.blocked_jobs AS
SELECT j.id, j.workflow_id, w.name AS workflow, j.workflow_key AS key, j.job_type AS type,
       j.deps_pending, j.created_at,
       array_agg(p.workflow_key || ' (' || p.status || ')' ORDER BY p.workflow_key)
           FILTER (WHERE p.status <> 'COMPLETED') AS waiting_for
FROM __schema__.jobs j
JOIN __schema__.workflows w ON w.id = j.workflow_id
JOIN __schema__.job_dependencies d ON d.job_id = j.id
JOIN __schema__.jobs p ON p.id = d.depends_on
WHERE j.workflow_id IS NOT NULL AND j.status = 'WAITING'
GROUP BY j.id, w.name;
