"""Conveyor: background jobs where accepting a job is a database commit."""

from .core.errors import ConveyorError, Retry
from .core.jobs import Status
from .enqueue import enqueue, enqueue_many
from .jobs.spec import JobSpec
from .router import Job, JobRouter
from .workflows import Workflow, cancel_workflow, chain, chord, enqueue_workflow, group

__all__ = [
    "ConveyorError",
    "Job",
    "JobRouter",
    "JobSpec",
    "Retry",
    "Status",
    "Workflow",
    "cancel_workflow",
    "chain",
    "chord",
    "enqueue",
    "enqueue_many",
    "enqueue_workflow",
    "group",
]
