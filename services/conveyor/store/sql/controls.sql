-- name: job_claim_controlled
-- See controls.py; the parameters are job_claim_many's plus the pen ladder and the room the
-- worker keeps in hand per controlled type. A paused type's jobs wait in the 5 s pen;
-- claimable is attempts.sql's test.
WITH t AS (
    -- the type rows, locked for this statement only, in name order; a locking read returns a
    -- row's newest version, so the claims and starts recorded there are exact even when they
    -- were committed after this statement's snapshot was taken
    SELECT name, paused, concurrency, rate_limit, rate_period, claim_ids, claim_attempts,
           ARRAY(SELECT s FROM unnest(recent_starts) s
                 WHERE rate_period IS NOT NULL
                   AND s > statement_timestamp() - make_interval(secs => rate_period)
                 ORDER BY s) AS win
    FROM __schema__.job_types WHERE name = ANY(:types::text[]) ORDER BY name FOR UPDATE
), listed AS (
    -- claims recorded on the type row that may still run: the snapshot shows an older attempt
    -- (claimed after it was taken) or that attempt still IN_PROGRESS
    SELECT t.name, e.id, e.att FROM t, unnest(t.claim_ids, t.claim_attempts) AS e(id, att)
    JOIN __schema__.jobs r ON r.id = e.id
    WHERE r.attempts < e.att OR (r.attempts = e.att AND r.status = 'IN_PROGRESS')
), c AS (
    SELECT t.*,
           t.concurrency - (SELECT count(DISTINCT x.id) FROM (
                                SELECT r.id FROM __schema__.jobs r
                                WHERE r.job_type = t.name AND r.status = 'IN_PROGRESS'
                                UNION ALL SELECT l.id FROM listed l WHERE l.name = t.name) x
                            ) AS conc_free,
           t.rate_limit - cardinality(t.win) AS rate_free,
           (:room::int4[])[array_position(:types::text[], t.name)] AS room
    FROM t
), cand AS (
    SELECT j.id, j.job_type, j.run_at, j.created_at,
           row_number() OVER (PARTITION BY j.job_type ORDER BY j.priority DESC, j.id) AS rn
    FROM __schema__.jobs j
    WHERE j.id = ANY(:ids::uuid[]) AND array_position(:types::text[], j.job_type) IS NOT NULL
      AND CASE j.status WHEN 'PENDING' THEN true WHEN 'RETRYING'
          THEN j.run_at <= now() + interval '1 second' ELSE false END
), pick AS (
    SELECT cand.*, c.paused, c.conc_free, c.rate_free, c.rate_limit, c.rate_period, c.win,
           coalesce(c.room, 0) AS room,
           (NOT coalesce(c.paused, false) AND cand.rn <= coalesce(least(c.conc_free, c.rate_free),
                                                                  cand.rn)) AS go
    FROM cand LEFT JOIN c ON c.name = cand.job_type
), upd AS (
    UPDATE __schema__.jobs j SET
        status = 'IN_PROGRESS',
        attempts = j.attempts + 1,
        started_at = statement_timestamp(),
        updated_at = statement_timestamp(),
        lease_expires_at = statement_timestamp() + make_interval(secs => :lease_seconds),
        worker_id = :worker_id,
        max_retries = COALESCE(j.max_retries,
                               (:handler_defaults::jsonb -> j.job_type ->> 'max_retries')::int,
                               :default_max_retries),
        timeout_seconds = COALESCE(j.timeout_seconds,
                                   (:handler_defaults::jsonb -> j.job_type ->> 'timeout')::float8)
    FROM pick
    WHERE j.id = pick.id AND pick.go AND CASE j.status WHEN 'PENDING' THEN true
        WHEN 'RETRYING' THEN j.run_at <= now() + interval '1 second' ELSE false END
    RETURNING j.id, j.job_type, j.payload::text AS payload, j.priority, j.attempts,
              j.retry_count, j.max_retries, j.timeout_seconds, j.meta::text AS meta,
              j.trace_context,
              greatest(0, extract(epoch FROM statement_timestamp()
                                              - COALESCE(j.run_at, j.created_at)))::float8 AS wait,
              j.workflow_id, CASE WHEN j.workflow_id IS NOT NULL THEN (
                  SELECT jsonb_object_agg(p.workflow_key, jsonb_build_object(
                      'status', p.status, 'result', p.result))
                  FROM __schema__.job_dependencies d
                  JOIN __schema__.jobs p ON p.id = d.depends_on
                  WHERE d.job_id = j.id)::text END AS parents  -- as in job_claim_many
), keep AS (
    SELECT name, id, att FROM listed UNION ALL SELECT job_type, id, attempts FROM upd
), starts AS (
    UPDATE __schema__.job_types ty
    SET recent_starts = CASE WHEN c.rate_limit IS NULL THEN ty.recent_starts
                             ELSE c.win || array_fill(statement_timestamp(), ARRAY[n.n]) END,
        claim_ids = CASE WHEN c.concurrency IS NULL THEN '{}'
                         ELSE ARRAY(SELECT k.id FROM keep k WHERE k.name = ty.name
                                    ORDER BY k.id) END,
        claim_attempts = CASE WHEN c.concurrency IS NULL THEN '{}'
                              ELSE ARRAY(SELECT k.att FROM keep k WHERE k.name = ty.name
                                         ORDER BY k.id) END
    FROM (SELECT job_type, count(*)::int AS n FROM upd GROUP BY job_type) n, c
    WHERE ty.name = n.job_type AND c.name = ty.name
      AND (c.rate_limit IS NOT NULL OR c.concurrency IS NOT NULL)
), hold AS (
    -- the n-th job over a full window waits for the window's (size - limit + n)-th start to
    -- leave it (the starts claimed just now included: when that index is past the window)
    SELECT pick.id, (pick.rate_free IS NOT NULL AND pick.rn > pick.rate_free) AS rate_held,
        -- held for a full concurrency limit only, within the room the worker has: kept in its
        -- hand (no pen) and claimed again as soon as a slot frees
        (NOT coalesce(pick.paused, false) AND pick.conc_free IS NOT NULL
         AND pick.rn > pick.conc_free
         AND (pick.rate_free IS NULL OR pick.rn <= pick.rate_free)
         AND pick.rn - greatest(pick.conc_free, 0) <= pick.room) AS in_hand,
        greatest(
        CASE WHEN pick.paused THEN 5 ELSE 1 END,
        CASE WHEN pick.conc_free IS NOT NULL AND pick.rn > pick.conc_free
             THEN least(10, extract(epoch FROM statement_timestamp()
                                                - COALESCE(pick.run_at, pick.created_at)) / 4)
             ELSE 0 END,
        CASE WHEN pick.rate_free IS NOT NULL AND pick.rn > pick.rate_free
             THEN extract(epoch FROM COALESCE(
                 pick.win[(cardinality(pick.win) - pick.rate_limit + pick.rn)::int]
                     + make_interval(secs => pick.rate_period),
                 statement_timestamp() + make_interval(secs => pick.rate_period))
                 - statement_timestamp())
             ELSE 0 END) AS wait_for
    FROM pick WHERE NOT pick.go
), pen AS (
    SELECT hold.*, CASE WHEN hold.in_hand THEN 0 ELSE
        coalesce((SELECT min(p) FROM unnest(:pen_ladder::int4[]) p WHERE p >= hold.wait_for),
                 21600) END AS delay
    FROM hold
), held AS (
    -- a job held for its rate window (a pen of up to the window's length) is not due before
    -- the pen hands it back: the reconciler, which re-publishes jobs due for longer than
    -- reconcile_after and missing from their queue, must not take it for lost (it would add
    -- a copy per pass); short holds (pause, concurrency: <= 10 s) keep their run_at. The
    -- claimable test again: a job another claimer took meanwhile is left alone.
    UPDATE __schema__.jobs j SET updated_at = statement_timestamp(),
        lease_expires_at = statement_timestamp()
                           + make_interval(secs => pen.delay + :lease_seconds),
        run_at = CASE WHEN pen.rate_held
                      THEN statement_timestamp() + make_interval(secs => pen.delay)
                      ELSE j.run_at END
    FROM pen
    WHERE j.id = pen.id AND CASE j.status WHEN 'PENDING' THEN true WHEN 'RETRYING'
        THEN j.run_at <= now() + interval '1 second' ELSE false END
    RETURNING j.id, j.job_type, j.priority, pen.delay
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds)
    SELECT id, job_type, priority, 'retry', delay FROM held WHERE delay > 0
)
SELECT false AS held, id, job_type, payload, priority, attempts, retry_count, max_retries,
       timeout_seconds, meta, trace_context, wait, workflow_id, parents FROM upd
UNION ALL
SELECT true, id, job_type, NULL, priority, NULL, NULL, NULL, NULL, NULL, NULL, delay, NULL, NULL
FROM held

-- name: job_release_held
-- Jobs a worker held in hand for a concurrency slot and gives up (its drain): back through the
-- shortest pen, their hold dropped so the reconciler treats them as any other job again.
WITH r AS (
    UPDATE __schema__.jobs j SET lease_expires_at = NULL, updated_at = now()
    WHERE j.id = ANY($1::uuid[]) AND CASE j.status WHEN 'PENDING' THEN true WHEN 'RETRYING'
        THEN j.run_at <= now() + interval '1 second' ELSE false END
    RETURNING j.id, j.job_type, j.priority
)
INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds)
SELECT id, job_type, priority, 'retry', 1 FROM r

-- name: type_controls
SELECT name, paused, concurrency, rate_limit, rate_period FROM __schema__.job_types
ORDER BY name

-- name: type_set_paused
UPDATE __schema__.job_types SET paused = $2 WHERE name = $1 RETURNING name

-- name: type_set_limits
-- An operator's limits: registering workers keep them from now on (``limits_set_at``).
UPDATE __schema__.job_types SET concurrency = $2, rate_limit = $3, rate_period = $4,
    limits_set_at = now(),
    recent_starts = CASE WHEN $3::int4 IS NULL THEN '{}' ELSE recent_starts END
WHERE name = $1 RETURNING name
