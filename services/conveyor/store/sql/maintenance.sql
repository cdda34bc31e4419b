-- The sweeper's statements (maintenance.py). A waiting job (PENDING/RETRYING) with a lease in
-- the future is *held* (the fragment ``job_unheld`` is the opposite): a worker has its delivery
-- in hand, waiting for a slot (``job_touch_waiting``). Its message is not among the queue's
-- ready ones, and it is not lost: the reconciler counts it neither as overdue nor as fresh. Held
-- is for a bounded time only (a holder that dies stops renewing it).
-- Finishing statements record attempts as attempts.sql explains (``job_attempt_insert``).

-- name: job_unheld fragment
(j.lease_expires_at IS NULL OR j.lease_expires_at <= now())

-- name: job_promote_due
WITH due AS (
    SELECT id FROM __schema__.jobs WHERE status = 'SCHEDULED' AND run_at <= now()
    ORDER BY run_at LIMIT $1 FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE __schema__.jobs j SET status = 'PENDING', updated_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.job_type, j.priority, j.status
), ob AS (  -- a job under admission waits for it instead (admission.sql)
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM upd WHERE status = 'PENDING'
)
SELECT count(*) FROM upd

-- name: job_expired_ids
-- The jobs lease recovery takes next (``job_recover_expired``): IN_PROGRESS without a lease first,
-- then those whose lease expired, the longest expired first; up to ``$1``, leaving out the jobs
-- set aside (``$2``: their recovery failed, ``core/isolate.py``). Two ranges of
-- ``jobs_lease_idx`` (no lease; an expired one), each read up to the batch: written as one
-- ``lease < now() OR lease IS NULL`` ordered NULLS FIRST, the plan reads every running job's index
-- entry and row and sorts them, on every idle pass.
SELECT c.id FROM (
    (SELECT x.id, x.lease_expires_at FROM __schema__.jobs x
     WHERE x.status = 'IN_PROGRESS' AND x.lease_expires_at IS NULL
       AND NOT (x.id = ANY($2::uuid[])) LIMIT $1)
    UNION ALL
    (SELECT x.id, x.lease_expires_at FROM __schema__.jobs x
     WHERE x.status = 'IN_PROGRESS' AND x.lease_expires_at < now()
       AND NOT (x.id = ANY($2::uuid[]))
     ORDER BY x.lease_expires_at LIMIT $1)
) c
ORDER BY c.lease_expires_at NULLS FIRST LIMIT $1

-- name: job_recover_expired
-- Expired leases: the worker died or hung. Of the jobs ``$1`` (``job_expired_ids``), those still
-- IN_PROGRESS with an expired lease or none (checked on the locked row; a row locked elsewhere is
-- skipped). With retries left (``j.retry_count < COALESCE(j.max_retries, $2)``) the job waits in
-- a holding pen for the default exponential backoff (2^n s with jitter over the upper half,
-- snapped up to the pen ladder ``$3``), so a job that crashes its worker does not hit the fleet
-- again every lease period; otherwise it fails and is dead-lettered. A pending cancellation
-- wins. ``retry_count`` counts retries performed: it never exceeds ``max_retries``. An
-- IN_PROGRESS job without a lease was not claimed by a worker (an operator's UPDATE): it is
-- recovered the same way, and since its attempt number was not advanced, its attempt row may
-- exist already (kept, not replaced).
WITH exp AS (
    SELECT id, (SELECT COALESCE(min(p) FILTER (WHERE p >= d.secs), max(p))
                FROM unnest($3::int4[]) p) AS delay, COALESCE(run_at, created_at) AS due
    FROM __schema__.jobs jj,
         LATERAL (SELECT least(2.0 ^ (jj.retry_count + 1), 3600.0) * (0.5 + random() / 2)
                  AS secs) d
    WHERE jj.id = ANY($1::uuid[])
      -- a CASE, so the planner finds the rows by their ids
      AND CASE WHEN status = 'IN_PROGRESS' AND (lease_expires_at < now()
                    OR lease_expires_at IS NULL) THEN true ELSE false END
    FOR UPDATE OF jj SKIP LOCKED
), upd AS (
    UPDATE __schema__.jobs j SET
        status = (CASE WHEN j.cancel_requested THEN 'CANCELLED'
                       WHEN j.retry_count < COALESCE(j.max_retries, $2) THEN 'RETRYING'
                       ELSE 'FAILED' END)::__schema__.job_status,
        retry_count = j.retry_count + (CASE WHEN NOT j.cancel_requested
            AND j.retry_count < COALESCE(j.max_retries, $2)
                                            THEN 1 ELSE 0 END),
        last_error = CASE WHEN j.lease_expires_at IS NULL
                          THEN 'IN_PROGRESS without a lease (not a worker''s claim) at attempt '
                          ELSE 'lease expired: worker ' || COALESCE(j.worker_id, '?')
                               || ' stopped heartbeating during attempt ' END || j.attempts,
        run_at = CASE WHEN NOT j.cancel_requested AND j.retry_count < COALESCE(j.max_retries, $2)
                      THEN now() + make_interval(secs => exp.delay) ELSE j.run_at END,
        finished_at = CASE WHEN j.cancel_requested
            OR NOT j.retry_count < COALESCE(j.max_retries, $2) THEN now() END,
        lease_expires_at = NULL, updated_at = now()
    FROM exp WHERE j.id = exp.id
    RETURNING j.id, j.job_type, j.attempts, j.worker_id, j.started_at, j.status, exp.due AS due,
        j.priority, j.last_error, j.last_error AS error, exp.delay,
        CASE WHEN j.status = 'CANCELLED' THEN 'cancelled' ELSE 'lease_expired' END AS outcome
), att AS ({{job_attempt_insert}} ON CONFLICT DO NOTHING
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds,
                                       error, attempt)
    SELECT id, job_type, priority, CASE WHEN status = 'FAILED' THEN 'dead' ELSE 'retry' END,
           CASE WHEN status = 'RETRYING' THEN delay END,
           CASE WHEN status = 'FAILED' THEN last_error END,
           CASE WHEN status = 'FAILED' THEN attempts END
    FROM upd WHERE status IN ('RETRYING', 'FAILED')
)
SELECT id, status::text AS status, job_type FROM upd

-- name: job_count_overdue
-- Jobs that should have reached a worker long ago and have no outbox row in flight: counted per
-- type, so the reconciler can compare with the broker's queue depth before re-publishing. The
-- overdue jobs are found first (``jobs_waiting_idx``, an empty range when all is well) and only
-- then checked against the outbox: a hash of a large outbox (a relay that fell behind) is built
-- only when some job is overdue, not on every idle pass.
WITH c AS MATERIALIZED (
    SELECT id, job_type FROM __schema__.jobs j
    WHERE j.status IN ('PENDING', 'RETRYING')
      AND j.updated_at < now() - make_interval(secs => $1)
      AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $1))
      AND {{job_unheld}}
)
SELECT job_type, count(*) AS n FROM c
WHERE NOT EXISTS (SELECT 1 FROM __schema__.job_outbox o WHERE o.job_id = c.id)
GROUP BY job_type

-- name: job_recount_overdue
-- The recount under a type's reconcile lock, in one snapshot: its overdue jobs (as above) and its
-- *fresh* ones: due now (``run_at`` passed; a job in a holding pen is not in the work queue) but
-- not overdue, with no outbox row; held jobs are neither. Only the ready messages beyond the
-- fresh jobs can stand for overdue ones (``Sweeper.reconcile``). Reads the waiting jobs
-- (``jobs_waiting_idx``, partial: PENDING/RETRYING only) of a type the idle count found overdue
-- jobs of: an idle pass never runs it.
WITH w AS MATERIALIZED (
    SELECT id, (j.updated_at < now() - make_interval(secs => $2)
                AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $2))) AS late
    FROM __schema__.jobs j
    WHERE j.job_type = $1 AND j.status IN ('PENDING', 'RETRYING')
      AND (j.run_at IS NULL OR j.run_at <= now())
      AND {{job_unheld}}
)
SELECT count(*) FILTER (WHERE late) AS overdue, count(*) FILTER (WHERE NOT late) AS fresh
FROM w WHERE NOT EXISTS (SELECT 1 FROM __schema__.job_outbox o WHERE o.job_id = w.id)

-- name: job_republish_overdue
WITH o AS (
    SELECT id FROM __schema__.jobs j
    WHERE j.job_type = $1 AND j.status IN ('PENDING', 'RETRYING')
      AND j.updated_at < now() - make_interval(secs => $2)
      AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $2))
      AND NOT EXISTS (SELECT 1 FROM __schema__.job_outbox x WHERE x.job_id = j.id)
      AND {{job_unheld}} AND j.id = ANY($4::uuid[])
    ORDER BY COALESCE(j.run_at, j.created_at) LIMIT $3 FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE __schema__.jobs j SET updated_at = now() FROM o WHERE j.id = o.id
    RETURNING j.id, j.job_type, j.priority
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM upd
)
SELECT count(*) FROM upd

-- name: job_overdue_ids
-- The overdue jobs of a type due the longest (since ``run_at``, else since created): the
-- reconciler's suspects, re-published by its next pass only if they are still overdue then. Not
-- by ``updated_at``: a worker's touch of a job it holds moves that, and a job held and released
-- again and again would be passed over each time.
SELECT id FROM __schema__.jobs j
WHERE j.job_type = $1 AND j.status IN ('PENDING', 'RETRYING')
  AND j.updated_at < now() - make_interval(secs => $2)
  AND (j.run_at IS NULL OR j.run_at < now() - make_interval(secs => $2))
  AND NOT EXISTS (SELECT 1 FROM __schema__.job_outbox x WHERE x.job_id = j.id)
      AND {{job_unheld}}
ORDER BY COALESCE(j.run_at, j.created_at) LIMIT $3

-- name: maintenance_bound
-- A sweeper duty's transaction that takes locks other sweepers wait for or skip (the schedules
-- pass, a type's reconcile) opens with this: PostgreSQL ends the session of a sweeper that sits
-- idle inside it for $1 (paused: a frozen VM, a long GC; its connection stays open, so nothing
-- else would release the locks) and fails any lock wait after $2. SET LOCAL: both end with the
-- transaction. Also reads the clock, so the bound costs no extra round trip.
SELECT clock_timestamp() AS now,
       set_config('idle_in_transaction_session_timeout', $1, true) AS idle,
       set_config('lock_timeout', $2, true) AS lock_wait

-- name: job_reconcile_lock
-- One replica at a time reconciles a type: the lock is held by the transaction that recounts and
-- re-publishes, so a replica cannot add its own copy of a shortfall another one is filling.
SELECT pg_try_advisory_xact_lock(hashtextextended('__schema__:reconcile:' || $1, 0))

-- name: job_delete_expired
-- Retention, in small batches, oldest first: COMPLETED/CANCELLED jobs finished more than ``$1``
-- seconds ago (``jobs_done_idx``) and FAILED ones more than ``$2`` seconds ago
-- (``jobs_failed_idx``); an idle pass reads an empty range of each. A job's attempts go with it
-- (``job_attempts`` has no foreign key, see ``schema.py``). A workflow's jobs go with their
-- workflow, once it has finished (``workflow_delete_expired``).
WITH done AS (
    SELECT id FROM __schema__.jobs WHERE status IN ('COMPLETED', 'CANCELLED')
      AND finished_at < now() - make_interval(secs => $1) AND workflow_id IS NULL
    ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED
), failed AS (
    SELECT id FROM __schema__.jobs WHERE status = 'FAILED'
      AND finished_at < now() - make_interval(secs => $2) AND workflow_id IS NULL
    ORDER BY finished_at LIMIT greatest($3 - (SELECT count(*) FROM done), 0) FOR UPDATE SKIP LOCKED
), d AS (
    SELECT id FROM done UNION ALL SELECT id FROM failed
), a AS (
    DELETE FROM __schema__.job_attempts a USING d WHERE a.job_id = d.id
)
DELETE FROM __schema__.jobs j USING d WHERE j.id = d.id

-- name: duties_try_lock
-- The duties' election (``cli/duties.py``): of the ``conveyor api`` and ``conveyor worker``
-- processes, the one whose session holds this lock runs the relay and the maintenance duties. A
-- session lock: it lasts until the session ends (a crash, a partition found by the keepalives, a
-- freeze ended by ``idle_session_timeout``) or the holder gives it up. Per schema: two installs
-- in one database elect apart.
SELECT pg_try_advisory_lock(hashtextextended('__schema__:duties', 0))

-- name: duties_held
-- Does this session still hold the duties' lock? (A bigint advisory lock shows its high and low
-- halves as ``classid`` and ``objid``, ``objsubid`` 1.) False through a transaction pooler, where
-- the next statement may run on another server session: there is no election there.
WITH k AS (SELECT hashtextextended('__schema__:duties', 0) AS key)
SELECT EXISTS (
    SELECT 1 FROM pg_locks l, k
    WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
      AND l.objsubid = 1
      AND l.classid = ((k.key >> 32) & 4294967295)::oid
      AND l.objid = (k.key & 4294967295)::oid
)

-- name: duties_session_bound
-- The election's session ends after ``$1`` idle outside a transaction (PostgreSQL 14 and later):
-- a holder that stops turning (a frozen process on a host that still answers its keepalives)
-- loses the lock to another process. SET for the session: its connection is its own.
SELECT set_config('idle_session_timeout', $1, false)

-- name: admission_types
-- The types with jobs waiting for admission: one probe of ``jobs_admit_idx`` per type.
WITH RECURSIVE t(name) AS (
    SELECT min(job_type) FROM __schema__.jobs
    WHERE status = 'WAITING' AND partition_key IS NOT NULL
    UNION ALL
    SELECT (SELECT min(job_type) FROM __schema__.jobs
            WHERE status = 'WAITING' AND partition_key IS NOT NULL AND job_type > t.name)
    FROM t WHERE t.name IS NOT NULL
)
SELECT name FROM t WHERE name IS NOT NULL

-- name: admit
-- One admission pass of a type (``admit`` in schema/admission.sql); ``$3``: count only.
SELECT __schema__.admit($1, $2, $3)
