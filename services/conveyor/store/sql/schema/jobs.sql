-- Jobs, their outbox, their attempts and their unique keys. Every object lives in one schema
-- (``__schema__``: CONVEYOR_DB_SCHEMA, default ``conveyor``) beside the application's tables.

CREATE TYPE __schema__.job_status AS ENUM (
    'WAITING',      -- for its dependencies (a workflow), or for admission (a limit)
    'PENDING',      -- due: its outbox row or its message is on the way to a worker
    'SCHEDULED',    -- due at run_at
    'IN_PROGRESS',  -- claimed: a worker runs it under a lease
    'RETRYING',     -- failed, due again at run_at (in a holding pen meanwhile)
    'COMPLETED',
    'FAILED',       -- its retries exhausted: a dead letter
    'CANCELLED'
);

CREATE TABLE __schema__.jobs (
    id uuid PRIMARY KEY,  -- UUIDv7: time-ordered, so keyset pages order by it
    job_type text NOT NULL,
    status __schema__.job_status NOT NULL,
    priority smallint NOT NULL CONSTRAINT jobs_priority_range CHECK (priority BETWEEN 0 AND 9),
    payload jsonb NOT NULL CONSTRAINT jobs_payload_object CHECK (jsonb_typeof(payload) = 'object'),
    result jsonb,
    -- NULL until the first claim: then the handler's default (or the global one) is written
    max_retries integer,
    timeout_seconds double precision,
    -- failures consumed so far (errors, timeouts, lost leases); Retry(delay) does not count
    retry_count integer NOT NULL DEFAULT 0,
    -- claims so far: the fencing token of every write after a claim
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    run_at timestamptz,
    lease_expires_at timestamptz,
    worker_id text,
    cancel_requested boolean NOT NULL DEFAULT false,
    idempotency_key text,
    request_hash text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    meta jsonb,  -- the submit's ``meta`` (at most 8 KiB); NULL: none
    -- {"percent", "message", "updated_at"}: the running attempt's report (job.set_progress)
    progress jsonb,
    -- the W3C traceparent of the submit: its attempts join that trace
    trace_context text,
    -- the workflow it belongs to, its key there, and how many of its dependencies are not met
    -- yet (WAITING until 0); NULL for a plain job
    workflow_id uuid,
    workflow_key text,
    deps_pending integer,
    -- admission (admission.sql): the job's partition key ('' for a type limited as a whole);
    -- NULL for a job of a type without limits, which never waits for admission
    partition_key text,
    -- an ordered type's job: its place among its key's jobs, in the order their submits
    -- committed (0 until its transaction commits)
    admit_seq bigint,
    -- a debounced submit's key (admission.sql): while the job waits, a submit with the same key
    -- replaces its payload and moves its run_at, never past debounce_until
    debounce_key text,
    debounce_until timestamptz
) WITH (
    -- Every status change leaves a dead row version (status is indexed, so no update is HOT):
    -- the default 20 % scale factor lets 2M dead rows pile up at 10M rows before a vacuum,
    -- bloating the hot indexes and clearing the visibility map the index-only counts rely on.
    -- Vacuum after 1 % (+1,000), analyze after 2 % (+1,000), an insert-driven vacuum after 5 %
    -- (+10,000) new rows, and a cost limit that lets one vacuum of a big table end in minutes.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_vacuum_cost_limit = 2000
);

-- Every status change writes an entry in each index: the indexes are few, and partial where
-- they can be. Operator queries and GET /jobs: backlog by type and status, in id order.
CREATE INDEX jobs_type_status_id_idx ON __schema__.jobs (job_type, status, id);
CREATE UNIQUE INDEX jobs_idempotency_key_idx ON __schema__.jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Maintenance: due scheduled and retrying jobs, expired leases.
CREATE INDEX jobs_due_idx ON __schema__.jobs (run_at) WHERE status IN ('SCHEDULED', 'RETRYING');
CREATE INDEX jobs_lease_idx ON __schema__.jobs (lease_expires_at) WHERE status = 'IN_PROGRESS';
-- Retention, oldest first: COMPLETED and CANCELLED after retention_days, FAILED after
-- failed_retention_days, each from its own index, so an idle pass reads no row not yet due.
CREATE INDEX jobs_done_idx ON __schema__.jobs (finished_at)
    WHERE status IN ('COMPLETED', 'CANCELLED');
CREATE INDEX jobs_failed_idx ON __schema__.jobs (finished_at) WHERE status = 'FAILED';
-- The reconciler: PENDING and RETRYING jobs by last touch; an idle pass reads an empty range.
CREATE INDEX jobs_waiting_idx ON __schema__.jobs (updated_at, job_type)
    WHERE status IN ('PENDING', 'RETRYING');
-- A workflow's jobs, by status.
CREATE INDEX jobs_workflow_idx ON __schema__.jobs (workflow_id, status)
    WHERE workflow_id IS NOT NULL;

-- The gauges count each (type, status) exactly up to a cap and ask the planner above it.
-- Without these statistics the planner multiplies the type's frequency by the status's, as if
-- they were independent: a type whose jobs all fail would be estimated at a fraction of its
-- size. ANALYZE computes the list from the columns' own sample: nothing is paid on a write.
CREATE STATISTICS __schema__.jobs_type_status (mcv) ON job_type, status FROM __schema__.jobs;

-- What the relay publishes: written in the transaction that makes a job due, deleted once the
-- broker confirmed the message.
CREATE TABLE __schema__.job_outbox (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    job_id uuid NOT NULL,
    job_type text NOT NULL,
    priority smallint NOT NULL,
    -- work: the type's queue; retry: the holding pen of delay_seconds; dead: dead letters
    destination text NOT NULL DEFAULT 'work'
        CONSTRAINT job_outbox_destination_check CHECK (destination IN ('work', 'retry', 'dead')),
    delay_seconds integer,
    error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- dead letters: the attempt that failed, so a redrive from the queue is fenced
    attempt integer
);

-- One row per finished attempt, inserted by the statement that finishes it (the running
-- attempt is read from its jobs row). No foreign key: its per-row check would cost every
-- finishing statement a trigger call; retention deletes a job's attempts with the job.
CREATE TABLE __schema__.job_attempts (
    job_id uuid,
    attempt integer,
    job_type text NOT NULL,
    worker_id text,
    started_at timestamptz,
    finished_at timestamptz NOT NULL,
    outcome text NOT NULL CONSTRAINT job_attempts_outcome_check
        CHECK (outcome IN ('completed', 'retry', 'failed', 'cancelled', 'released',
                           'lease_expired')),
    error text,
    duration_seconds double precision,
    wait_seconds double precision,  -- due (run_at, else created_at) to started
    PRIMARY KEY (job_id, attempt)
);
-- Rows arrive in finishing order, so a BRIN index serves "the last hour" (views, dashboard)
-- for almost nothing on the hot path.
CREATE INDEX job_attempts_finished_brin ON __schema__.job_attempts USING brin (finished_at);

-- A unique key (unique_for on submit, a schedule's tick) and the job holding it until
-- expires_at; the submit statement takes an expired key over.
CREATE TABLE __schema__.job_uniques (
    key text PRIMARY KEY,
    job_id uuid NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX job_uniques_expires_idx ON __schema__.job_uniques (expires_at);
