"""PostgreSQL: the only code that runs SQL.

``Store(schema)`` holds every statement rendered for one schema (``CONVEYOR_DB_SCHEMA``) and
offers one method per statement, named entity first (``job_claim_many``,
``outbox_take_batch``). Each takes a connection and never commits: the caller owns the
transaction. The statements are named blocks of ``sql/*.sql`` loaded by ``registry`` (listed by
name in ``registry.TEMPLATES``); each file has one module of the same name that adds its
methods to ``Store``, all on one typed base (``base.Statements``: ``schema`` and ``sql``):

- ``jobs``: submit (plain, unique keys and meta), read, cancel, redrive;
- ``attempts``: what workers do: the claims (plain and limited), heartbeat, progress, outcomes,
  and a job's attempt history;
- ``types``: registered job types and their controls (pause, fleet-wide limits), the keys of
  partitioned types and an operator's settings of each;
- ``outbox``: the relay's rows; ``maintenance``: the sweeper's duties; ``schedules``;
- ``stats``: counts, gauges and the dashboard's reads and bulk actions;
- ``keys``: API keys and rate buckets; ``probes``: readiness; ``testing``: ``conveyor.testing``."""

from __future__ import annotations

import functools

from .attempts import AttemptStatements, Beat, ProgressReport
from .base import Connection
from .jobs import Inserted, JobStatements
from .keys import ApiKeyRow, KeyStatements
from .maintenance import MaintenanceStatements
from .outbox import OutboxStatements
from .probes import HEAD, ProbeStatements
from .registry import render
from .rows import (
    Attempt,
    AttemptRow,
    ClaimedJob,
    Completion,
    Debounce,
    Failure,
    JobRow,
    JobStatus,
    JobType,
    JobTypeDefaults,
    NewJob,
    OutboxRow,
    PartitionRow,
    TypeControl,
)
from .schedules import ScheduleStatements
from .schema import DEFAULT_SCHEMA, outbox_channel
from .stats import StatsStatements
from .testing import TestingStatements
from .types import TypeStatements
from .workflow_pages import WorkflowPageStatements
from .workflows import WorkflowStatements


class Store(
    JobStatements,
    AttemptStatements,
    TypeStatements,
    OutboxStatements,
    MaintenanceStatements,
    ScheduleStatements,
    StatsStatements,
    KeyStatements,
    ProbeStatements,
    TestingStatements,
    WorkflowStatements,
    WorkflowPageStatements,
):
    """The statements of one schema. Cheap to share: build it once per process (``for_schema``)."""

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        self.schema = schema
        self.sql = render(schema)

    @property
    def channel(self) -> str:
        """The NOTIFY channel of this install's outbox."""
        return outbox_channel(self.schema)


@functools.cache
def for_schema(schema: str = DEFAULT_SCHEMA) -> Store:
    return Store(schema)


__all__ = [
    "DEFAULT_SCHEMA",
    "HEAD",
    "ApiKeyRow",
    "Attempt",
    "AttemptRow",
    "Beat",
    "ClaimedJob",
    "Completion",
    "Connection",
    "Debounce",
    "Failure",
    "Inserted",
    "JobRow",
    "JobStatus",
    "JobType",
    "JobTypeDefaults",
    "NewJob",
    "OutboxRow",
    "PartitionRow",
    "ProgressReport",
    "Store",
    "TypeControl",
    "for_schema",
]
