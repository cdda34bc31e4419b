-- name: outbox_take_batch
-- The relay takes a batch in one statement: the rows are deleted inside the relay's open
-- transaction, which commits only after every publish is confirmed. A crash before the commit
-- rolls the delete back (the rows are published again: duplicates, never losses); rows whose
-- publish failed are put back with ``outbox_restore`` before the commit. Rows of job types
-- (``$2``) and retry pens (``$3``) whose declaration the broker refuses stay where they are
-- meanwhile (see ``broker/publish.py``). ``id = ANY(ARRAY(…))``, not ``id IN (…)``: the
-- semi-join hashed the taken ids and read the whole outbox to find them, a sequential scan per
-- batch that made draining a backlog of millions quadratic.
DELETE FROM __schema__.job_outbox
WHERE id = ANY(ARRAY(
    SELECT id FROM __schema__.job_outbox
    WHERE job_type <> ALL($2::text[])
      AND (destination <> 'retry' OR delay_seconds <> ALL($3::int4[]))
    ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
))
RETURNING id, job_id, job_type, priority, destination, delay_seconds, error, attempt

-- name: outbox_take_batch_traced
-- Tracing on (``core/tracing.py``): outbox_take_batch, with each job's trace context (a primary-key
-- lookup per row, paid only by a relay that traces), so every message a job ever gets (work,
-- retry, redrive, reconciler) carries its ``traceparent``.
DELETE FROM __schema__.job_outbox
WHERE id = ANY(ARRAY(
    SELECT id FROM __schema__.job_outbox
    WHERE job_type <> ALL($2::text[])
      AND (destination <> 'retry' OR delay_seconds <> ALL($3::int4[]))
    ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
))
RETURNING id, job_id, job_type, priority, destination, delay_seconds, error, attempt,
          (SELECT j.trace_context FROM __schema__.jobs j WHERE j.id = job_id) AS trace_context

-- name: outbox_restore
INSERT INTO __schema__.job_outbox (id, job_id, job_type, priority, destination, delay_seconds,
                                   error, attempt)
SELECT * FROM unnest(:id::int8[], :job_id::uuid[], :job_type::text[], :priority::int2[],
                     :destination::text[], :delay_seconds::int4[], :error::text[],
                     :attempt::int4[])

-- name: outbox_delete_confirmed
-- Rows put back because their confirms did not come within the publish wait, whose confirms came
-- later (a resource alarm cleared): their messages are in the broker, so they are not published
-- again. A row another relay holds meanwhile is left to it (it publishes a duplicate, never a loss).
DELETE FROM __schema__.job_outbox
WHERE id = ANY(ARRAY(
    SELECT id FROM __schema__.job_outbox WHERE id = ANY($1::int8[]) FOR UPDATE SKIP LOCKED
))

-- name: outbox_held_ids
-- Rows a relay holds: of the outbox's oldest ``$1`` rows (a relay takes the oldest first, so a
-- batch it never commits stays at the head), those another transaction has locked (deleted, not
-- committed). ``FOR KEY SHARE SKIP LOCKED`` skips exactly those, and holds its own lock only for
-- this statement (a relay's ``FOR UPDATE SKIP LOCKED`` passes over them meanwhile); it needs
-- UPDATE on the table, as the relay's own lock does (``roles.py``).
WITH head AS MATERIALIZED (
    SELECT id FROM __schema__.job_outbox ORDER BY id LIMIT $1
), free AS MATERIALIZED (
    SELECT id FROM __schema__.job_outbox WHERE id = ANY(ARRAY(SELECT id FROM head))
    FOR KEY SHARE SKIP LOCKED
)
SELECT id FROM head WHERE id <> ALL(ARRAY(SELECT id FROM free)) ORDER BY id

-- name: outbox_requeue_held
-- A copy, under a new id, of each of the rows ``$1`` that is still held (the relay holding it
-- may have committed its delete or lost its session meanwhile): the copy is free for any relay.
WITH free AS MATERIALIZED (
    SELECT id FROM __schema__.job_outbox WHERE id = ANY($1::int8[]) FOR KEY SHARE SKIP LOCKED
), copied AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds,
                                       error, attempt)
    SELECT job_id, job_type, priority, destination, delay_seconds, error, attempt
    FROM __schema__.job_outbox
    WHERE id = ANY($1::int8[]) AND id <> ALL(ARRAY(SELECT id FROM free))
    ORDER BY id
    RETURNING job_id
)
SELECT count(*) FROM copied

-- name: outbox_notify
-- The channel is per schema (``<schema>_outbox``), so two installs in one database do not wake
-- each other's publishers.
SELECT pg_notify('__schema___outbox', '')

-- name: outbox_watch
-- Is anything relaying? The age of the outbox's oldest row (by id, the order relays take them:
-- a primary-key lookup, not a scan; NULL when empty) and how many relay sessions are connected to
-- this database (``Relay`` names its connections ``conveyor-publisher``; any role may read another
-- session's ``application_name``).
SELECT (SELECT extract(epoch FROM now() - o.created_at)::float8
        FROM __schema__.job_outbox o ORDER BY o.id LIMIT 1) AS oldest,
       (SELECT count(*) FROM pg_stat_activity a
        WHERE a.datname = current_database()
          AND a.application_name IN ('conveyor-publisher', 'conveyor-publisher-listen'))::int
           AS relays
