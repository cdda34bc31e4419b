-- What operators and workers control: job types with their pause and limits, schedules, API
-- keys and the submit quota's buckets.

-- The job types workers registered, with their handlers' defaults: the API accepts these.
CREATE TABLE __schema__.job_types (
    name text PRIMARY KEY,
    max_retries integer,
    timeout_seconds double precision,
    retry_delays integer[],
    first_seen timestamptz NOT NULL DEFAULT now(),
    last_seen timestamptz NOT NULL DEFAULT now(),
    -- pause and fleet-wide limits (admission.sql enforces them)
    paused boolean NOT NULL DEFAULT false,
    concurrency integer CONSTRAINT job_types_concurrency_positive CHECK (concurrency > 0),
    rate_limit integer,
    rate_period integer,
    -- an operator changed the limits at run time, so registering workers keep them
    limits_set_at timestamptz,
    -- the partition key's payload fields, and the limits of each key
    partition_by text[],
    partition_concurrency integer
        CONSTRAINT job_types_partition_concurrency_positive CHECK (partition_concurrency > 0),
    partition_rate_limit integer,
    partition_rate_period integer,
    -- each key's jobs one at a time in commit order; a FAILED head holds its key ('hold') or
    -- is passed over ('continue')
    ordered text CONSTRAINT job_types_ordered_check CHECK (ordered IN ('hold', 'continue')),
    -- the key last served by admission's round robin
    admit_cursor text,
    CONSTRAINT job_types_rate_positive
        CHECK ((rate_limit IS NULL) = (rate_period IS NULL) AND rate_limit > 0 AND rate_period > 0),
    CONSTRAINT job_types_partition_rate_positive
        CHECK ((partition_rate_limit IS NULL) = (partition_rate_period IS NULL)
               AND partition_rate_limit > 0 AND partition_rate_period > 0)
);

CREATE TABLE __schema__.schedules (
    name text PRIMARY KEY,
    job_type text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    cron text,
    every_seconds double precision,
    timezone text NOT NULL DEFAULT 'UTC',
    priority smallint NOT NULL DEFAULT 5
        CONSTRAINT schedules_priority_range CHECK (priority BETWEEN 0 AND 9),
    enabled boolean NOT NULL DEFAULT true,
    -- ticks missed while no sweeper ran: skip them, or run the last one
    catch_up text NOT NULL DEFAULT 'skip'
        CONSTRAINT schedules_catch_up_check CHECK (catch_up IN ('skip', 'last')),
    -- api: POST /schedules; cli: conveyor schedules; code: schedule= / every= on a handler
    source text NOT NULL DEFAULT 'api'
        CONSTRAINT schedules_source_check CHECK (source IN ('api', 'cli', 'code')),
    next_run_at timestamptz,
    last_tick_at timestamptz,
    last_job_id uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_one_rule CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);
CREATE INDEX schedules_due_idx ON __schema__.schedules (next_run_at) WHERE enabled;

-- API keys: only a SHA-256 of each key, looked up by its public id.
CREATE TABLE __schema__.api_keys (
    key_id text PRIMARY KEY,
    name text NOT NULL,
    key_hash bytea NOT NULL CONSTRAINT api_keys_hash_length CHECK (octet_length(key_hash) = 32),
    scopes text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE UNIQUE INDEX api_keys_active_name_idx ON __schema__.api_keys (name)
    WHERE revoked_at IS NULL;

-- The fleet-wide submit quota (CONVEYOR_RATE_LIMIT): one token bucket per key that submitted
-- (anonymous with auth disabled), tokens left at ``at``; granted is what the last take handed
-- out. An API process takes a chunk of tokens at a time. UNLOGGED: after a crash the buckets
-- start full again, which only forgives a burst.
CREATE UNLOGGED TABLE __schema__.api_rate (
    key_id text PRIMARY KEY,
    tokens double precision NOT NULL,
    granted double precision NOT NULL,
    at timestamptz NOT NULL
);
