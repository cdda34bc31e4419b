-- Admission: one mechanism for every limit. A job of a type with a limit (the type's
-- concurrency or rate_limit, or any partition setting) or submitted with a partition key has a
-- ``partition_key`` ('' for a type limited as a whole) and waits WAITING, with no outbox row and
-- no broker message, until ``admit`` makes it PENDING with its outbox row. The broker only ever
-- holds jobs that may run. A job of a type without limits has no partition key and never comes
-- here: the triggers below test ``partition_key IS NOT NULL`` in their WHEN.
--
-- The slots are counted from the jobs themselves, never kept in counters: a key's running jobs
-- are its PENDING (admitted) and IN_PROGRESS ones, a rate window the starts (``started_at``) in
-- it plus the admitted jobs not started yet. ``admit`` runs one type at a time under a
-- transaction-level advisory lock, so two admitters never both count a slot as free; an
-- admitter frozen inside its transaction is ended by its session bound and admits nothing.

-- An operator's settings of one key (PUT /types/{type}/partitions/{key}), and an ordered key's
-- commit counter.
CREATE TABLE __schema__.partitions (
    job_type text,
    key text,
    concurrency integer CONSTRAINT partitions_concurrency_positive CHECK (concurrency > 0),
    paused boolean NOT NULL DEFAULT false,
    seq bigint NOT NULL DEFAULT 0,  -- the last admit_seq given to a job of this key
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_type, key)
);

-- The waiting jobs of each key, in the order admission takes them; the first entry of each key
-- is found by one probe (a skip scan written as a recursive query).
CREATE INDEX jobs_admit_idx ON __schema__.jobs (job_type, partition_key, priority DESC, id)
    WHERE status = 'WAITING' AND partition_key IS NOT NULL;
-- The admitted jobs of each key (its busy slots).
CREATE INDEX jobs_admitted_idx ON __schema__.jobs (job_type, partition_key, status)
    WHERE status IN ('PENDING', 'IN_PROGRESS') AND partition_key IS NOT NULL;
-- The starts in a rate window: of each key, and of the type.
CREATE INDEX jobs_key_starts_idx ON __schema__.jobs (job_type, partition_key, started_at)
    WHERE partition_key IS NOT NULL;
-- (``attempts > 0``, true of every started job, is in the type's query only: a key's query
-- cannot take this index, which, with statistics older than the window's starts, it did,
-- reading every start of the type for each key: 20 s a pass at 10,000 keys)
CREATE INDEX jobs_type_starts_idx ON __schema__.jobs (job_type, started_at)
    WHERE partition_key IS NOT NULL AND attempts > 0;
-- The job a debounced submit folds into: the one of its type and key waiting, never started (a
-- retry waiting again is not one: it started).
CREATE UNIQUE INDEX jobs_debounce_idx ON __schema__.jobs (job_type, debounce_key)
    WHERE status = 'WAITING' AND debounce_key IS NOT NULL AND attempts = 0;
-- An ordered key's head: its first job, by commit order, not finished.
CREATE INDEX jobs_ordered_idx ON __schema__.jobs (job_type, partition_key, admit_seq)
    WHERE admit_seq IS NOT NULL AND status NOT IN ('COMPLETED', 'CANCELLED');

-- Whether a type's jobs go through admission: any limit, or a partition setting.
CREATE FUNCTION __schema__.admitted_type(t __schema__.job_types) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $fn$
SELECT t.concurrency IS NOT NULL OR t.rate_limit IS NOT NULL OR t.partition_by IS NOT NULL
    OR t.partition_concurrency IS NOT NULL OR t.partition_rate_limit IS NOT NULL
    OR t.ordered IS NOT NULL
$fn$;

-- A submitted job's partition key: the one given, else the payload's ``partition_by`` fields
-- (several joined by '/'), else '' for a type limited as a whole. A partitioned type's job
-- without one is refused (check_violation on the constraint name ``missing_partition_key``).
CREATE FUNCTION __schema__.partition_key_for(t __schema__.job_types, given text, payload jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    k text;
BEGIN
    IF given IS NOT NULL THEN
        RETURN given;
    ELSIF t.partition_by IS NOT NULL THEN
        SELECT CASE WHEN bool_and(jsonb_typeof(payload -> f) IN ('string', 'number', 'boolean'))
                    THEN string_agg(payload ->> f, '/' ORDER BY n) END
        INTO k FROM unnest(t.partition_by) WITH ORDINALITY AS x(f, n);
    ELSIF NOT (t.partition_concurrency IS NOT NULL OR t.partition_rate_limit IS NOT NULL
               OR t.ordered IS NOT NULL) THEN
        RETURN '';
    END IF;
    IF k IS NULL OR k = '' OR length(k) > 200 THEN
        RAISE EXCEPTION 'a job of type % needs a partition key: %', t.name,
            CASE WHEN t.partition_by IS NULL THEN 'give partition_key'
                 ELSE format('the payload field(s) %s (a string, number or boolean, 1-200 '
                             'characters), or partition_key', array_to_string(t.partition_by, ', '))
            END
            USING ERRCODE = 'check_violation', CONSTRAINT = 'missing_partition_key';
    END IF;
    RETURN k;
END
$fn$;

-- A job under admission that becomes due any other way than by ``admit`` (a release by its
-- dependencies, a retry, a lease recovery, a redrive, a worker handing it back, an operator's
-- edit) waits for admission instead: WAITING, due at its ``run_at``. The statement's RETURNING
-- shows WAITING, so it writes no outbox row. ``admit`` itself moves a WAITING job with no
-- dependency pending to PENDING, which the WHEN leaves alone. Named to run after
-- ``jobs_workflow_redriven`` (BEFORE triggers run in name order), which sees the redrive first.
CREATE FUNCTION __schema__.admission_wait() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.run_at := CASE WHEN NEW.status IN ('SCHEDULED', 'RETRYING') THEN NEW.run_at END;
    NEW.status := 'WAITING';
    NEW.lease_expires_at := NULL;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER jobs_zz_admission_wait BEFORE UPDATE OF status ON __schema__.jobs FOR EACH ROW
WHEN (NEW.partition_key IS NOT NULL AND NEW.status IN ('PENDING', 'SCHEDULED', 'RETRYING')
      AND OLD.status IS DISTINCT FROM NEW.status
      AND NOT (OLD.status = 'WAITING' AND NEW.status = 'PENDING'
               AND COALESCE(OLD.deps_pending, 0) = 0))
EXECUTE FUNCTION __schema__.admission_wait();

-- An ordered type's job takes its place among its key's jobs when its transaction commits
-- (a deferred trigger): the key's row is locked from here to the commit, so the places follow
-- the order in which the submits committed. The lock is held for the commit only, never
-- while the submitting transaction is open; its wait is bounded.
CREATE FUNCTION __schema__.ordered_place() RETURNS trigger LANGUAGE plpgsql
SET lock_timeout = '10s'
AS $fn$
DECLARE
    place bigint;
BEGIN
    INSERT INTO __schema__.partitions AS p (job_type, key, seq)
    VALUES (NEW.job_type, NEW.partition_key, 1)
    ON CONFLICT (job_type, key) DO UPDATE SET seq = p.seq + 1
    RETURNING seq INTO place;
    UPDATE __schema__.jobs SET admit_seq = place WHERE id = NEW.id;
    RETURN NULL;
END
$fn$;

CREATE CONSTRAINT TRIGGER jobs_ordered_place AFTER INSERT ON __schema__.jobs
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
WHEN (NEW.admit_seq = 0)
EXECUTE FUNCTION __schema__.ordered_place();

-- One admission pass of a type: make PENDING (with outbox rows) the waiting jobs that may start
-- now, at most ``win`` admitted and not started at once (the admission window: how far ahead of
-- the workers the broker is filled), keys served in turn. Returns how many it admitted.
-- ``dry``: change nothing and count what would be admitted if the window were unbounded (the
-- admissible gauge).
--
-- The type's room: the window less its admitted jobs not started, within its concurrency and
-- rate. Each key's room: within its concurrency (the operator's override, else the type's
-- ``partition_concurrency``) and rate, one at a time for an ordered type (its head only).
-- Within a priority level the keys are served round robin: every key's first job before any
-- key's second, starting after the key served last (``admit_cursor``); higher priorities first.
-- A job whose last start is still inside a rate window waits for it to leave (one job is never
-- two starts of one window).
-- Every statement reads by index whatever the statistics were when it was planned (an ANALYZE of
-- an empty table made the admitted jobs' lock a sequential scan of the table).
CREATE FUNCTION __schema__.admit(type_name text, win int, dry boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql
SET enable_seqscan = off
AS $fn$
DECLARE
    t __schema__.job_types%ROWTYPE;
    room int;
    gap interval;
    key_gap interval;
    type_gap interval;
    picked uuid[];
    last_key text;
    budget int;
    n int;
BEGIN
    -- one admitter of a type at a time; while another holds it (a pass in progress, or a
    -- worker's outcome transaction, which admits what it frees) this one leaves the type to it
    -- and goes on: a frozen holder delays its type by its session bound at most, never others
    IF NOT dry AND NOT pg_try_advisory_xact_lock(hashtext('__schema__.admit'),
                                                  hashtext(type_name)) THEN
        RETURN 0;
    END IF;
    SELECT * INTO t FROM __schema__.job_types y WHERE y.name = type_name;
    IF t.paused THEN
        RETURN 0;
    END IF;
    -- "PENDING" is written so that only jobs_admitted_idx serves it: as status = 'PENDING' it
    -- implies jobs_waiting_idx's predicate too, whose scan reads every waiting job of every type
    room := CASE WHEN dry THEN 2147483647 ELSE win - (
        SELECT count(*) FROM __schema__.jobs x
        WHERE x.job_type = type_name AND x.partition_key IS NOT NULL
          AND x.status IN ('PENDING', 'IN_PROGRESS')
          AND CASE x.status WHEN 'PENDING' THEN true ELSE false END)::int END;
    IF t.concurrency IS NOT NULL THEN
        room := least(room, t.concurrency - (
            SELECT count(*) FROM __schema__.jobs x
            WHERE x.job_type = type_name AND x.status IN ('PENDING', 'IN_PROGRESS'))::int);
    END IF;
    type_gap := make_interval(secs => t.rate_period);
    key_gap := make_interval(secs => t.partition_rate_period);
    gap := greatest(type_gap, key_gap);
    IF t.rate_limit IS NOT NULL THEN
        room := least(room, t.rate_limit - (
            SELECT count(*) FROM __schema__.jobs x
            WHERE x.job_type = type_name AND x.partition_key IS NOT NULL AND x.attempts > 0
              AND x.started_at > now() - type_gap)::int - (
            SELECT count(*) FROM __schema__.jobs x
            WHERE x.job_type = type_name AND x.partition_key IS NOT NULL
              AND x.status IN ('PENDING', 'IN_PROGRESS')
              AND CASE x.status WHEN 'PENDING' THEN true ELSE false END
              AND COALESCE(x.started_at <= now() - type_gap, true))::int);
    END IF;
    IF room <= 0 THEN
        RETURN 0;
    END IF;
    budget := CASE WHEN NOT dry THEN 2 * least(room, 100000) + 100 END;
    -- the keys with waiting jobs, in turn: those after the key served last, then from the first
    -- one (a probe of jobs_admit_idx each; all from the first one when none was served yet), at
    -- most ``budget`` of them: a pass reads the keys it may serve, not every key of the type
    WITH RECURSIVE after(k) AS (
        SELECT min(x.partition_key) FROM __schema__.jobs x
        WHERE x.job_type = type_name AND x.status = 'WAITING'
          AND x.partition_key > t.admit_cursor
        UNION ALL
        SELECT (SELECT min(x.partition_key) FROM __schema__.jobs x
                WHERE x.job_type = type_name AND x.status = 'WAITING'
                  AND x.partition_key > after.k)
        FROM after WHERE after.k IS NOT NULL
    ), wrapped(k) AS (
        SELECT min(x.partition_key) FROM __schema__.jobs x
        WHERE x.job_type = type_name AND x.status = 'WAITING' AND x.partition_key IS NOT NULL
        UNION ALL
        SELECT (SELECT min(x.partition_key) FROM __schema__.jobs x
                WHERE x.job_type = type_name AND x.status = 'WAITING'
                  AND x.partition_key > wrapped.k)
        FROM wrapped WHERE wrapped.k <= COALESCE(t.admit_cursor, wrapped.k)
    ), keys(k) AS (
        SELECT y.k FROM (
            (SELECT after.k FROM after WHERE after.k IS NOT NULL)
            UNION ALL
            (SELECT wrapped.k FROM wrapped
             WHERE wrapped.k <= COALESCE(t.admit_cursor, wrapped.k))
        ) y LIMIT budget
    ), kr AS (
        SELECT keys.k, b.busy, least(
            COALESCE(p.concurrency, t.partition_concurrency) - b.busy,
            CASE WHEN t.ordered IS NOT NULL THEN 1 - b.busy END,
            CASE WHEN t.partition_rate_limit IS NOT NULL THEN t.partition_rate_limit - (
                SELECT count(*) FROM __schema__.jobs x
                WHERE x.job_type = type_name AND x.partition_key = keys.k
                  AND x.started_at > now() - key_gap)::int - (
                SELECT count(*) FROM __schema__.jobs x
                WHERE x.job_type = type_name AND x.partition_key = keys.k
                  AND x.status IN ('PENDING', 'IN_PROGRESS')
                  AND CASE x.status WHEN 'PENDING' THEN true ELSE false END
                  AND COALESCE(x.started_at <= now() - key_gap, true))::int END,
            room) AS free
        FROM keys
        LEFT JOIN __schema__.partitions p ON p.job_type = type_name AND p.key = keys.k
        CROSS JOIN LATERAL (
            SELECT count(*)::int AS busy FROM __schema__.jobs x
            WHERE x.job_type = type_name AND x.partition_key = keys.k
              AND x.status IN ('PENDING', 'IN_PROGRESS')) b
        WHERE keys.k IS NOT NULL AND NOT COALESCE(p.paused, false)
    ), cand AS (
        -- an ordered key: its head, if it waits and may start
        SELECT kr.k, h.id, h.priority FROM kr
        CROSS JOIN LATERAL (
            SELECT x.id, x.priority, x.status, x.deps_pending, x.run_at, x.started_at
            FROM __schema__.jobs x
            WHERE x.job_type = type_name AND x.partition_key = kr.k AND x.admit_seq IS NOT NULL
              AND x.status NOT IN ('COMPLETED', 'CANCELLED')
              AND (t.ordered = 'hold' OR x.status <> 'FAILED')
            ORDER BY x.admit_seq LIMIT 1) h
        WHERE t.ordered IS NOT NULL AND kr.free > 0 AND h.status = 'WAITING'
          AND COALESCE(h.deps_pending, 0) = 0 AND COALESCE(h.run_at <= now(), true)
          AND COALESCE(h.started_at <= now() - gap, true)
        UNION ALL
        -- any other key: its first jobs that may start, as many as it has room for
        SELECT kr.k, x.id, x.priority FROM kr
        CROSS JOIN LATERAL (
            SELECT x.id, x.priority FROM __schema__.jobs x
            WHERE x.job_type = type_name AND x.partition_key = kr.k AND x.status = 'WAITING'
              AND COALESCE(x.deps_pending, 0) = 0 AND COALESCE(x.run_at <= now(), true)
              AND COALESCE(x.started_at <= now() - gap, true)
            ORDER BY x.priority DESC, x.id LIMIT greatest(kr.free, 0)) x
        WHERE t.ordered IS NULL
    ), ranked AS (
        SELECT cand.*, row_number() OVER (PARTITION BY cand.k ORDER BY cand.priority DESC,
                                                                       cand.id) AS turn
        FROM cand
    ), pick AS (
        SELECT ranked.id, ranked.k, row_number() OVER (
            ORDER BY ranked.priority DESC, ranked.turn,
                     ranked.k <= COALESCE(t.admit_cursor, ''), ranked.k) AS ord
        FROM ranked ORDER BY ord LIMIT room
    )
    SELECT array_agg(pick.id), (array_agg(pick.k ORDER BY pick.ord DESC))[1]
    INTO picked, last_key FROM pick;
    IF picked IS NULL THEN
        RETURN 0;
    ELSIF dry THEN
        RETURN cardinality(picked);
    END IF;
    -- the picked jobs still waiting and due, locked; one whose row another transaction holds
    -- (a debounced submit folding into it, in an application's open transaction) is left for a
    -- later pass rather than waited for, and a row changed since this pass read it is checked
    -- again as it is now (a fold moved its run_at)
    WITH l AS (
        SELECT x.id FROM __schema__.jobs x
        WHERE x.id = ANY(picked) AND x.status = 'WAITING'
          AND COALESCE(x.deps_pending, 0) = 0 AND COALESCE(x.run_at <= now(), true)
        FOR UPDATE SKIP LOCKED
    ), a AS (
        UPDATE __schema__.jobs x SET status = 'PENDING', updated_at = now()
        FROM l WHERE x.id = l.id
        RETURNING x.id, x.job_type, x.priority
    ), ob AS (
        INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
        SELECT a.id, a.job_type, a.priority FROM a
    )
    SELECT count(*) INTO n FROM a;
    UPDATE __schema__.job_types y SET admit_cursor = last_key
    WHERE y.name = type_name AND y.admit_cursor IS DISTINCT FROM last_key;
    IF n > 0 THEN
        PERFORM pg_notify('__schema___outbox', '');
    END IF;
    RETURN n;
END
$fn$;

-- The jobs of a type waiting for admission that its limits would admit if the fleet had room:
-- the backlog an autoscaler should see (the gauge conveyor_jobs_admissible; KEDA's postgresql
-- trigger in k8s/components/keda-postgresql). Jobs held back by a limit are not in it.
CREATE FUNCTION __schema__.admissible(type_name text) RETURNS integer
LANGUAGE sql AS $fn$
SELECT __schema__.admit(type_name, 0, true)
$fn$;

-- Why a job waits (the job resource's ``waiting_for``): 'dependencies', 'run_at', 'paused',
-- 'ordered', 'partition_limit', 'partition_rate', 'type_limit', 'type_rate'; NULL when it does
-- not wait, or waits only for its turn in the admission window.
CREATE FUNCTION __schema__.waiting_for(j __schema__.jobs) RETURNS text
LANGUAGE sql STABLE AS $fn$
SELECT CASE
    WHEN j.status <> 'WAITING' THEN NULL
    WHEN j.deps_pending > 0 THEN 'dependencies'
    WHEN j.run_at > now() THEN 'run_at'
    WHEN j.partition_key IS NULL THEN NULL
    WHEN t.paused OR p.paused THEN 'paused'
    WHEN t.ordered IS NOT NULL AND (busy > 0 OR (
        SELECT h.id FROM __schema__.jobs h
        WHERE h.job_type = j.job_type AND h.partition_key = j.partition_key
          AND h.admit_seq IS NOT NULL AND h.status NOT IN ('COMPLETED', 'CANCELLED')
          AND (t.ordered = 'hold' OR h.status <> 'FAILED')
        ORDER BY h.admit_seq LIMIT 1) IS DISTINCT FROM j.id) THEN 'ordered'
    WHEN busy >= COALESCE(p.concurrency, t.partition_concurrency) THEN 'partition_limit'
    WHEN j.started_at > now() - make_interval(secs => t.partition_rate_period)
         OR (SELECT count(*) FROM __schema__.jobs x
             WHERE x.job_type = j.job_type AND x.partition_key = j.partition_key
               AND x.started_at > now() - make_interval(secs => t.partition_rate_period))
            >= t.partition_rate_limit THEN 'partition_rate'
    WHEN (SELECT count(*) FROM __schema__.jobs x WHERE x.job_type = j.job_type
          AND x.status IN ('PENDING', 'IN_PROGRESS')) >= t.concurrency THEN 'type_limit'
    WHEN j.started_at > now() - make_interval(secs => t.rate_period)
         OR (SELECT count(*) FROM __schema__.jobs x
             WHERE x.job_type = j.job_type AND x.partition_key IS NOT NULL AND x.attempts > 0
               AND x.started_at > now() - make_interval(secs => t.rate_period))
            >= t.rate_limit THEN 'type_rate'
END
FROM (SELECT count(*) AS busy FROM __schema__.jobs x
      WHERE x.job_type = j.job_type AND x.partition_key = j.partition_key
        AND x.status IN ('PENDING', 'IN_PROGRESS')) b
LEFT JOIN __schema__.job_types t ON t.name = j.job_type
LEFT JOIN __schema__.partitions p ON p.job_type = j.job_type AND p.key = j.partition_key
$fn$;
