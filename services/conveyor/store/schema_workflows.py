"""Tables of workflows (migration 0016): the workflows, the jobs' dependencies and the columns
they add to ``jobs``. The release, the failure policy and the workflow's status live in the
triggers of that migration (docs/workflows.md)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

WORKFLOW_STATUSES = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED")
ON_FAILURE = ("cancel", "continue")


def define_workflows(metadata: sa.MetaData, jobs: sa.Table) -> None:
    # the workflow a job belongs to, its key there, and how many of its dependencies are not met
    # yet (WAITING until 0); NULL for a plain job
    jobs.append_column(sa.Column("workflow_id", pg.UUID(as_uuid=True), nullable=True))
    jobs.append_column(sa.Column("workflow_key", sa.Text(), nullable=True))
    jobs.append_column(sa.Column("deps_pending", sa.Integer(), nullable=True))
    sa.Index(
        "jobs_workflow_idx",
        jobs.c.workflow_id,
        jobs.c.status,
        postgresql_where=jobs.c.workflow_id.isnot(None),
    )
    statuses = ", ".join(f"'{s}'" for s in WORKFLOW_STATUSES)
    policies = ", ".join(f"'{p}'" for p in ON_FAILURE)
    workflows = sa.Table(
        "workflows",
        metadata,
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False, server_default="RUNNING"),
        sa.Column("on_failure", sa.Text(), nullable=False, server_default="cancel"),
        # cancel_workflow(): CANCELLED whatever its jobs did, and never running again
        sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        # POST /workflows' Idempotency-Key and the request it was used with (migration 0017)
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.CheckConstraint(f"status IN ({statuses})", name="workflows_status_check"),
        sa.CheckConstraint(f"on_failure IN ({policies})", name="workflows_on_failure_check"),
    )
    # the finishing duty's backstop reads the running ones; retention the finished, oldest first
    sa.Index(
        "workflows_running_idx",
        workflows.c.created_at,
        postgresql_where=workflows.c.status == "RUNNING",
    )
    sa.Index(
        "workflows_finished_idx",
        workflows.c.finished_at,
        postgresql_where=workflows.c.status != "RUNNING",
    )
    # GET /workflows filtered by status or by name, newest first (migration 0018)
    sa.Index("workflows_status_id_idx", workflows.c.status, workflows.c.id)
    sa.Index("workflows_name_id_idx", workflows.c.name, workflows.c.id)
    sa.Index(
        "workflows_idempotency_key_idx",
        workflows.c.idempotency_key,
        unique=True,
        postgresql_where=workflows.c.idempotency_key.isnot(None),
    )
    deps = sa.Table(
        "job_dependencies",
        metadata,
        sa.Column("job_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("depends_on", pg.UUID(as_uuid=True), primary_key=True),
    )
    sa.Index("job_dependencies_depends_on_idx", deps.c.depends_on)
