"""Settings, read from the environment once in an entry point and passed down."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .dburl import normalize_database_url


class Settings(BaseSettings):
    """Every knob of a Conveyor process. Environment variables carry the ``CONVEYOR_`` prefix."""

    model_config = SettingsConfigDict(env_prefix="CONVEYOR_", extra="ignore")

    database_url: str = "postgresql://postgres@127.0.0.1:5432/conveyor"
    # one URL, or several comma-separated URLs (or hosts) of one RabbitMQ cluster
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    # "quorum": work queues, holding pens and the dead-letter queue are replicated quorum queues
    # (a high-priority job goes to the type's ``.high`` queue, consumed first; docs/scaling.md)
    queue_type: Literal["classic", "quorum"] = "classic"
    namespace: str = Field(default="jobs", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$")
    visibility_timeout: float = Field(default=30.0, gt=0)
    # PostgreSQL schema of Conveyor's tables, types and Alembic version table
    db_schema: str = Field(default="conveyor", pattern=r"^[a-z_][a-z0-9_]{0,62}$")

    # logs: text (key=value) or json (one object per line)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"] = (
        "INFO"
    )
    # a failed attempt's whole traceback below its job_attempt_failed line (`conveyor dev`
    # turns it on); otherwise the line names the error and where it was raised
    log_tracebacks: bool = False

    # API limits
    max_payload_bytes: int = Field(default=256 * 1024, gt=0)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    max_batch: int = Field(default=1000, gt=0)
    db_timeout: float = Field(default=1.5, gt=0)
    db_pool_size: int = Field(default=10, gt=0)
    # "transaction": every connection goes through PgBouncer in transaction pooling (no named
    # prepared statements, no session state); LISTEN/NOTIFY then needs listen_database_url (a
    # direct connection), else the publisher polls every relay_poll_interval
    db_pooler: Literal["none", "transaction"] = "none"
    listen_database_url: str | None = None
    # bounds PostgreSQL enforces on the components' own sessions (``store/bounds.py``;
    # docs/configuration.md), in seconds, 0 = off: a frozen or partitioned process's transaction is
    # rolled back and its locks released after db_idle_in_transaction_timeout; a statement
    # waiting longer than db_lock_timeout for a lock fails (retried as an outage); a vanished
    # peer is detected by TCP keepalives (idle, interval, count) and tcp_user_timeout
    db_idle_in_transaction_timeout: float = Field(default=5.0, ge=0)
    db_lock_timeout: float = Field(default=10.0, ge=0)
    db_statement_timeout: float = Field(default=60.0, ge=0)
    db_keepalives_idle: int = Field(default=5, ge=0)
    db_keepalives_interval: int = Field(default=2, ge=0)
    db_keepalives_count: int = Field(default=3, ge=0)
    db_tcp_user_timeout: float = Field(default=10.0, ge=0)
    # serve full tracebacks (server file paths) to every caller; otherwise only to `admin` keys
    # (with auth disabled, this is the only switch)
    api_expose_tracebacks: bool = False

    # security (docs/security.md): API keys with scopes on every route but the probes;
    # `conveyor dev` defaults to disabled and then binds loopback only
    auth: Literal["required", "disabled"] = "required"
    # /metrics: open (the default) or behind a key with jobs:read
    metrics_auth: Literal["open", "required"] = "open"
    # per-key submit rate, "<n>/s", "<n>/m" or "<n>/h" (unset: no limit); 429 with Retry-After
    rate_limit: str | None = Field(default=None, pattern=r"^\s*\d+(\.\d+)?\s*/\s*[smh]\s*$")
    # how long a verified key (or a revocation) is trusted without reading PostgreSQL again
    auth_cache_seconds: float = Field(default=2.0, ge=0, le=5)
    # the latest run_at a job submitted through the API may ask for, in days from now (ten
    # years, like delay_seconds' bound)
    max_schedule_days: float = Field(default=3650.0, gt=0, le=3_000_000)

    # accept job types no worker registered (job_types); off: 422 naming the known types
    accept_unknown_types: bool = False

    # job defaults when neither the submitter nor the handler says
    default_max_retries: int = Field(default=3, ge=0)

    # publisher
    relay_batch: int = Field(default=500, gt=0)
    relay_poll_interval: float = Field(default=1.0, gt=0)

    # the relay and the maintenance duties inside `conveyor api` and `conveyor worker` (one
    # process at a time holds them, docs/architecture.md); off: a dedicated `conveyor publisher`
    # must run. `conveyor publisher`, `sweeper` and `dev` always run theirs
    run_duties: bool = True
    # every process watches the outbox: its oldest row older than this (seconds) while no relay
    # is connected to the database is said in the log (once) and in the health details
    outbox_stale_after: float = Field(default=30.0, gt=0)

    # maintenance (the publisher's, or the duties' holder's, see docs/architecture.md)
    schedule_interval: float = Field(default=0.25, gt=0)
    lease_sweep_interval: float = Field(default=2.0, gt=0)
    reconcile_interval: float = Field(default=15.0, gt=0)
    # admission (docs/admission.md): how many jobs of a type may be admitted and not started yet
    # (how far ahead of the workers its queue is filled: about twice the fleet's slots for it),
    # and how often waiting jobs are looked at without a wake-up (a due retry, a rate window)
    admission_window: int = Field(default=200, gt=0)
    admission_interval: float = Field(default=0.05, gt=0)
    reconcile_after: float = Field(default=60.0, gt=0)
    retention_days: float = Field(default=7.0, gt=0)
    # FAILED jobs are kept longer (for redrive and inspection), then deleted too
    failed_retention_days: float = Field(default=30.0, gt=0)
    # retention deletes this many jobs per transaction, pausing between batches, so a backlog
    # of millions of expired rows never holds back the hot path
    retention_batch: int = Field(default=500, gt=0)
    retention_pause: float = Field(default=0.05, ge=0)
    # schedules (docs/schedules.md): how often a sweeper looks for due ticks, and how old a
    # tick may be and still run (older: missed while no sweeper ran)
    schedules_interval: float = Field(default=0.5, gt=0)
    schedule_grace: float = Field(default=60.0, gt=0)
    # publisher and sweeper: a statement running longer is cancelled and fails its pass, so a
    # half-open connection cannot stall a loop for ever
    command_timeout: float = Field(default=30.0, gt=0)
    # sweeper liveness (``--health-port``): every duty completes a pass within its interval
    # plus this many seconds
    maintenance_deadline: float = Field(default=120.0, gt=0)

    # worker
    shutdown_grace: float = Field(default=25.0, ge=0)
    # deliveries of jobs running longer than this are acked early, before the broker's
    # consumer_timeout (30 min by default) would close the channel
    early_ack_after: float = Field(default=600.0, gt=0)
    worker_health_port: int | None = None
    # the AMQP heartbeat (seconds) of a worker's broker connection: RabbitMQ closes the
    # connection of a worker it heard nothing from for two to three of them (frozen: SIGSTOP, a
    # VM pause) and gives its unacknowledged deliveries to the other workers (0: no heartbeat;
    # a ``heartbeat`` in amqp_url's query wins)
    worker_amqp_heartbeat: int = Field(default=4, ge=0, le=65535)
    # liveness (see worker/health.py): the event loop blocked longer than this (seconds) ...
    worker_loop_stall_limit: float = Field(default=10.0, gt=0)
    # ... an outcome waiting to be written longer than this, or a sync handler waiting for a
    # thread longer than this ...
    worker_outcome_deadline: float = Field(default=60.0, gt=0)
    # ... or more handler threads abandoned (past their timeout, still running) than this
    worker_abandoned_thread_limit: int = Field(default=4, ge=0)
    # ... or every slot held by work running past its timeout for longer than this (seconds)
    worker_overrun_limit: float = Field(default=60.0, gt=0)
    # an async handler blocking the event loop longer than this (seconds) is preempted by the
    # loop guard even before its timeout, and its type's attempts on that worker are spaced out
    # (worker/guard.py, BlockPenalty), so its neighbours lose at most that long now and then
    # (0: at its timeout only, and no spacing)
    worker_loop_block_limit: float = Field(default=0.5, ge=0)
    # a worker whose completions release workflow jobs of its types claims them in the same
    # transaction and runs them at once, in the slots of the jobs it finished (worker/follow.py);
    # off: every released job goes through the relay and the broker
    worker_run_released: bool = True
    # a handler's result larger than this (encoded JSON, bytes) fails its job ("result too
    # large") instead of becoming a giant row that every outcome of the worker waits behind
    max_result_bytes: int = Field(default=1024 * 1024, gt=0)
    # how often a worker re-reads the job types' pause flags and limits (changes made through
    # the API/CLI take effect within this), and writes handlers' progress reports (per job)
    type_refresh_interval: float = Field(default=2.0, gt=0)
    progress_interval: float = Field(default=0.5, gt=0)

    @field_validator("database_url", "listen_database_url")
    @classmethod
    def _database_url(cls, url: str | None) -> str | None:
        """SQLAlchemy's ``postgresql+asyncpg://`` forms are accepted; a malformed URL is a
        one-line error (``core/dburl.py``)."""
        return None if url is None else normalize_database_url(url)
