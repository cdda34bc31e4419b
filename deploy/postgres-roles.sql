-- Conveyor least-privilege grants for schema conveyor (generated: conveyor roles sql).
-- Create the login roles first (as a superuser or CREATEROLE), with your passwords:
--   CREATE ROLE conveyor_api LOGIN PASSWORD '...';
--   CREATE ROLE conveyor_publisher LOGIN PASSWORD '...';
--   CREATE ROLE conveyor_worker LOGIN PASSWORD '...';
--   CREATE ROLE conveyor_sweeper LOGIN PASSWORD '...';
-- and, behind PgBouncer, JIT off on them (docs/scaling.md, "PgBouncer"):
--   ALTER ROLE conveyor_api SET jit = off;
--   ALTER ROLE conveyor_publisher SET jit = off;
--   ALTER ROLE conveyor_worker SET jit = off;
--   ALTER ROLE conveyor_sweeper SET jit = off;
-- and the session bounds (docs/configuration.md): ALTER ROLE <role> SET
-- idle_in_transaction_session_timeout, lock_timeout, statement_timeout,
-- tcp_keepalives_idle/_interval/_count, tcp_user_timeout (`conveyor migrate
-- --create-roles` sets them and jit).
-- then run this file as the role that ran `conveyor migrate` (the schema's owner).
-- Optional, if no other application needs it: REVOKE TEMPORARY ON DATABASE <db> FROM
-- PUBLIC (temporary tables are the one CREATE a runtime role could still run).
REVOKE ALL ON SCHEMA conveyor FROM PUBLIC;
GRANT USAGE ON SCHEMA conveyor TO conveyor_api;
GRANT SELECT ON conveyor.alembic_version TO conveyor_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON conveyor.jobs TO conveyor_api;
GRANT SELECT, DELETE ON conveyor.job_attempts TO conveyor_api;
GRANT SELECT, INSERT ON conveyor.job_outbox TO conveyor_api;
GRANT SELECT, UPDATE (paused, concurrency, rate_limit, rate_period, limits_set_at) ON conveyor.job_types TO conveyor_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON conveyor.partitions TO conveyor_api;
GRANT SELECT ON conveyor.api_keys TO conveyor_api;
GRANT SELECT, INSERT, UPDATE ON conveyor.api_rate TO conveyor_api;
GRANT SELECT, INSERT, UPDATE ON conveyor.job_uniques TO conveyor_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON conveyor.schedules TO conveyor_api;
GRANT SELECT, INSERT, UPDATE ON conveyor.workflows TO conveyor_api;
GRANT SELECT, INSERT ON conveyor.job_dependencies TO conveyor_api;
GRANT SELECT ON conveyor.backlog, conveyor.stuck_jobs, conveyor.recent_failures, conveyor.throughput, conveyor.running_workflows, conveyor.blocked_jobs, conveyor.workflow_counts TO conveyor_api;
GRANT USAGE ON SEQUENCE conveyor.job_outbox_id_seq TO conveyor_api;
GRANT USAGE ON SCHEMA conveyor TO conveyor_publisher;
GRANT SELECT ON conveyor.alembic_version TO conveyor_publisher;
GRANT SELECT, INSERT, UPDATE, DELETE ON conveyor.jobs TO conveyor_publisher;
GRANT SELECT, INSERT, DELETE ON conveyor.job_attempts TO conveyor_publisher;
GRANT SELECT, UPDATE (admit_cursor) ON conveyor.job_types TO conveyor_publisher;
GRANT SELECT, INSERT, UPDATE ON conveyor.partitions TO conveyor_publisher;
GRANT SELECT, INSERT, UPDATE, DELETE ON conveyor.job_uniques TO conveyor_publisher;
GRANT SELECT, UPDATE ON conveyor.schedules TO conveyor_publisher;
GRANT SELECT, UPDATE, DELETE ON conveyor.workflows TO conveyor_publisher;
GRANT SELECT, DELETE ON conveyor.job_dependencies TO conveyor_publisher;
GRANT SELECT ON conveyor.backlog, conveyor.stuck_jobs, conveyor.recent_failures, conveyor.throughput, conveyor.running_workflows, conveyor.blocked_jobs, conveyor.workflow_counts TO conveyor_publisher;
GRANT SELECT, INSERT, UPDATE, DELETE ON conveyor.job_outbox TO conveyor_publisher;
GRANT USAGE ON SEQUENCE conveyor.job_outbox_id_seq TO conveyor_publisher;
GRANT USAGE ON SCHEMA conveyor TO conveyor_worker;
GRANT SELECT ON conveyor.alembic_version TO conveyor_worker;
GRANT SELECT, INSERT, UPDATE ON conveyor.jobs TO conveyor_worker;
GRANT SELECT, INSERT ON conveyor.job_attempts TO conveyor_worker;
GRANT SELECT, INSERT, DELETE ON conveyor.job_outbox TO conveyor_worker;
GRANT SELECT, INSERT, UPDATE ON conveyor.job_types TO conveyor_worker;
GRANT SELECT, INSERT, UPDATE ON conveyor.partitions TO conveyor_worker;
GRANT SELECT, INSERT, UPDATE ON conveyor.job_uniques TO conveyor_worker;
GRANT SELECT, INSERT, UPDATE ON conveyor.schedules TO conveyor_worker;
GRANT SELECT, UPDATE ON conveyor.workflows TO conveyor_worker;
GRANT SELECT ON conveyor.job_dependencies TO conveyor_worker;
GRANT USAGE ON SEQUENCE conveyor.job_outbox_id_seq TO conveyor_worker;
GRANT USAGE ON SCHEMA conveyor TO conveyor_sweeper;
GRANT SELECT ON conveyor.alembic_version TO conveyor_sweeper;
GRANT SELECT, INSERT, UPDATE, DELETE ON conveyor.jobs TO conveyor_sweeper;
GRANT SELECT, INSERT, DELETE ON conveyor.job_attempts TO conveyor_sweeper;
GRANT SELECT, INSERT, UPDATE ON conveyor.job_outbox TO conveyor_sweeper;
GRANT SELECT, UPDATE (admit_cursor) ON conveyor.job_types TO conveyor_sweeper;
GRANT SELECT, INSERT, UPDATE ON conveyor.partitions TO conveyor_sweeper;
GRANT SELECT, INSERT, UPDATE, DELETE ON conveyor.job_uniques TO conveyor_sweeper;
GRANT SELECT, UPDATE ON conveyor.schedules TO conveyor_sweeper;
GRANT SELECT, UPDATE, DELETE ON conveyor.workflows TO conveyor_sweeper;
GRANT SELECT, DELETE ON conveyor.job_dependencies TO conveyor_sweeper;
GRANT SELECT ON conveyor.backlog, conveyor.stuck_jobs, conveyor.recent_failures, conveyor.throughput, conveyor.running_workflows, conveyor.blocked_jobs, conveyor.workflow_counts TO conveyor_sweeper;
GRANT USAGE ON SEQUENCE conveyor.job_outbox_id_seq TO conveyor_sweeper;
