"""Conveyor: background jobs where accepting a job is a database commit."""

from .core.errors import ConveyorError, Retry
from .core.jobs import Status
from .enqueue import enqueue, enqueue_many
from .jobs.router import CallNext, Job, JobRouter, Middleware
from .jobs.spec import JobSpec
from .workflows import Workflow, cancel_workflow, chain, chord, enqueue_workflow, group

__all__ = [
    "CallNext",
    "ConveyorError",
    "Job",
    "JobRouter",
    "JobSpec",
    "Middleware",
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
