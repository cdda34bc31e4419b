"""Claims read their workflow jobs' dependencies once per statement, and the completing worker
finds the outbox rows its release wrote by their primary key

- ``claimed_parents(ids)``: the dependencies (key -> status and result) of a claim's workflow
  jobs, one call per claiming statement for all of them. 0025's ``job_parents(id)`` was called
  per claimed row: a SQL function with a ``SET`` clause, so each call set and restored a setting
  and ran its own executor, and each statement planned its query again; about 33 µs per claimed
  job against 7 µs here (30-job claims, PostgreSQL 15). PL/pgSQL keeps the query's plan for the
  session, made with ``enable_seqscan`` off as before: every dependency and every parent is
  found by its primary key whatever the statistics were when it was planned. ``job_parents``
  stays for workers of the previous release still running during a rolling upgrade.
- ``take_released(types, room)``: the outbox rows the completing statement's release wrote
  (listed in the setting ``wf_released`` by ``workflow_jobs_finished``), at most ``room`` of
  them of ``types`` and of no paused or limited type, highest priority first, deleted and
  their jobs returned for the completing worker to claim. In the claim statement itself the
  lookup ``o.id = ANY(string_to_array(current_setting(...))::int8[])`` was planned with the
  statistics of ``job_outbox``, which is nearly empty whenever ANALYZE looks at it: a
  sequential scan, whose filter parsed the whole list again for every row of the outbox (on a
  freshly vacuumed outbox, 96-131 ms for a 1,000-job release and 9.5-11 s for 9,999, inside
  the completing transaction). Here the list is parsed once and each row is found by its
  primary key (4-6 ms and 20-36 ms). The jobs returned were released by this very transaction (their
  rows are locked by it and PENDING), so the claim that follows claims every one of them.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-26
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A dependency whose job row is gone (retention never deletes a running workflow's rows, an
# operator might) is left out, as 0025 did.
PARENTS = """
CREATE OR REPLACE FUNCTION {s}.claimed_parents(ids uuid[])
RETURNS TABLE (job_id uuid, parents text)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
BEGIN
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT d.job_id,
           jsonb_object_agg(p.workflow_key,
                            jsonb_build_object('status', p.status, 'result', p.result))::text
    FROM {s}.job_dependencies d
    JOIN LATERAL (SELECT p.workflow_key, p.status, p.result FROM {s}.jobs p
                  WHERE p.id = d.depends_on) p ON true
    WHERE d.job_id = ANY(ids)
    GROUP BY d.job_id;
END
$fn$
"""

TAKE = """
CREATE OR REPLACE FUNCTION {s}.take_released(types text[], room int)
RETURNS TABLE (job_id uuid)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
DECLARE
    listed int8[];
BEGIN
    listed := string_to_array(NULLIF(current_setting('{s}.wf_released', true), ''),
                              ',')::int8[];
    IF listed IS NULL OR room < 1 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT o.id FROM {s}.job_outbox o
        WHERE o.id = ANY(listed)
          AND o.destination = 'work'
          AND array_position(types, o.job_type) IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM {s}.job_types t
                          WHERE t.name = o.job_type
                            AND (t.paused OR t.concurrency IS NOT NULL
                                 OR t.rate_limit IS NOT NULL))
        ORDER BY o.priority DESC, o.id
        LIMIT room
    ), gone AS (
        DELETE FROM {s}.job_outbox d WHERE d.id = ANY(ARRAY(SELECT id FROM picked))
        RETURNING d.job_id
    )
    SELECT gone.job_id FROM gone;
END
$fn$
"""


def upgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(PARENTS.format(s=schema))
    op.execute(TAKE.format(s=schema))


def downgrade() -> None:
    schema = op.get_context().version_table_schema
    op.execute(f"DROP FUNCTION {schema}.take_released(text[], int)")
    op.execute(f"DROP FUNCTION {schema}.claimed_parents(uuid[])")
