"""Bodies of ``/workflows``: a workflow to submit (jobs, each with a key and the keys it waits
for, and every field of a job submit) and the workflow as served."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr
from pydantic.config import JsonDict

from ..core.jobs import Status
from ..workflows import DEFAULT_MAX_JOBS, MAX_KEY_LENGTH
from .models import NO_NUL, SubmitJob

Key = Annotated[StrictStr, Field(min_length=1, max_length=MAX_KEY_LENGTH, pattern=NO_NUL)]
WorkflowStatus = Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED"]

_EXAMPLE: dict[str, Any] = {
    "name": "nightly-report",
    "on_failure": "cancel",
    "jobs": [
        {"key": "fetch", "type": "fetch_data", "payload": {"day": "2026-11-25"}},
        {"key": "part-1", "type": "transform", "payload": {"i": 1}, "after": ["fetch"]},
        {"key": "part-2", "type": "transform", "payload": {"i": 2}, "after": ["fetch"]},
        {"key": "report", "type": "build_report", "after": ["part-1", "part-2"]},
    ],
}


class WorkflowJobIn(SubmitJob):
    """One job of the workflow: a job submit (``POST /jobs``' fields) under a key, after the
    jobs whose keys ``after`` names."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"key": "fetch", "type": "fetch_data", "payload": {"day": "2026-11-25"}}],
            "not": {"required": ["run_at", "delay_seconds"]},
        },
    )

    key: Key = Field(description="Unique in the workflow; `after` names jobs by it.")
    after: list[Key] = Field(
        default_factory=list,
        description="Keys of the jobs this one waits for (each once); it runs when all of them "
        "completed. Empty: it runs at once.",
        examples=[["fetch"]],
    )


class SubmitWorkflow(BaseModel):
    """A DAG of jobs, submitted in one transaction: all or none."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_EXAMPLE]})

    name: Key = Field(description="A name to find it by (not unique).", examples=["nightly"])
    on_failure: Literal["cancel", "continue"] = Field(
        default="cancel",
        description="`cancel`: a failed or cancelled job cancels every job downstream of it. "
        "`continue`: its dependents run anyway.",
    )
    # maxItems documents the default CONVEYOR_MAX_WORKFLOW_JOBS; the configured limit answers
    # 422 invalid_workflow
    jobs: list[WorkflowJobIn] = Field(
        min_length=1,
        description="The jobs, in any order; no cycle (10,000 at most by default).",
        json_schema_extra={"maxItems": DEFAULT_MAX_JOBS},
    )


class WorkflowCounts(BaseModel):
    jobs: int = Field(description="All jobs of the workflow.")
    waiting: int = Field(description="WAITING for a dependency.")
    queued: int = Field(description="PENDING, SCHEDULED or RETRYING.")
    running: int = Field(description="IN_PROGRESS.")
    completed: int
    failed: int
    cancelled: int


class WorkflowJobState(BaseModel):
    key: str = Field(description="The job's key in the workflow.", examples=["report"])
    id: uuid.UUID = Field(description="The job's id (`GET /jobs/{id}`).")
    type: str = Field(examples=["build_report"])
    status: Status
    after: list[str] = Field(description="The keys of the jobs it waits for.")
    depends_on: list[uuid.UUID] = Field(description="Their job ids.")
    last_error: str | None = Field(
        description="The last failure's final line, or why it was cancelled."
    )


class WorkflowSummary(BaseModel):
    """A workflow and how many of its jobs are in each state."""

    id: uuid.UUID = Field(description="The workflow id.")
    name: str = Field(examples=["nightly-report"])
    status: WorkflowStatus = Field(
        description="RUNNING until every job is final; then COMPLETED, FAILED (a job failed) "
        "or CANCELLED (cancelled, or a job was)."
    )
    on_failure: Literal["cancel", "continue"]
    created_at: datetime
    finished_at: datetime | None
    counts: WorkflowCounts


_ID, _JOB = "0193a0c4-1b2c-7d7e-8000-1f6b2e1c4a01", "0193a0c4-1b2c-7d7e-8000-1f6b2e1c4a02"
_RESOURCE: JsonDict = {
    "id": _ID,
    "name": "nightly-report",
    "status": "RUNNING",
    "on_failure": "cancel",
    "created_at": "2026-11-26T02:00:00Z",
    "finished_at": None,
    "counts": {"jobs": 2, "waiting": 1, "queued": 0, "running": 1, "completed": 0,
               "failed": 0, "cancelled": 0},
    "jobs": [
        {"key": "fetch", "id": _JOB, "type": "fetch_data", "status": "IN_PROGRESS",
         "after": [], "depends_on": [], "last_error": None},
        {"key": "report", "id": "0193a0c4-1b2c-7d7e-8000-1f6b2e1c4a03", "type": "build_report",
         "status": "WAITING", "after": ["fetch"], "depends_on": [_JOB], "last_error": None},
    ],
}  # fmt: skip


class WorkflowResource(WorkflowSummary):
    """A workflow with each of its jobs."""

    model_config = ConfigDict(json_schema_extra={"examples": [_RESOURCE]})

    jobs: list[WorkflowJobState] = Field(
        description="Its jobs, each after the jobs it waits for (level by level, by key)."
    )


class WorkflowPage(BaseModel):
    """One page of workflows, newest first."""

    workflows: list[WorkflowSummary] = Field(description="At most `limit` workflows.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )
