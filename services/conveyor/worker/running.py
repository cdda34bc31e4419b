"""What the worker's parts share about one claimed attempt."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ..broker.consume import Delivery
from ..jobs.router import HandlerSpec, Job
from ..store import NewJob, ProgressReport


@dataclass(eq=False)
class Running:
    """One claimed attempt, from the claim until its outcome is written."""

    job: Job
    spec: HandlerSpec | None
    timeout: float | None
    started: float  # the worker's clock at the claim
    delivery: Delivery | None = None  # unacked while the job runs (None once acked early)
    # a delivery handed over by a finished job (``follow.py``): when that job's delivery was
    # claimed (the early ack counts from it) and its type (the delivery's queue)
    handed_at: float | None = None
    handed_type: str | None = None
    task: asyncio.Task[Any] | None = field(default=None, repr=False)
    lease_lost: bool = False
    releasing: bool = False  # the drain cancelled it: hand it back, no retry consumed
    in_handler: bool = False  # the handler's own code runs (what the loop guard may preempt)
    # job.enqueue: inserted with the COMPLETED transition, only if it completes (followups.py)
    followups: list[NewJob] = field(default_factory=list, repr=False)
    last_progress: ProgressReport | None = None  # not yet written when the handler returned
    trace_parent: str | None = None  # tracing on: the parent of the attempt's span
    deadline_at: float | None = None  # the worker's clock when the attempt's timeout passes
    # threads the handler started through the worker's default executor (``sidework.py``),
    # still running: the attempt's slot stays busy until they end
    side_work: set[Any] = field(default_factory=set, repr=False)
    # work given up on (past its deadline + ``worker_overrun_limit``: ``Executor._give_up``),
    # still running: asyncio futures done when each piece ends; the job and the slot are held,
    # and the outcome written, only once they all are
    lingering: list[asyncio.Future[Any]] = field(default_factory=list, repr=False)
    given_up_at: float | None = None  # the worker's clock when its work was given up on
    note: str | None = None  # why its job is held: written to ``last_error`` by the heartbeater
    admitted: bool = False  # a job under admission: its outcome's transaction admits the next
    noted: bool = False

    @property
    def delivered(self) -> float:
        """The worker's clock when the job of its delivery was claimed."""
        return self.started if self.handed_at is None else self.handed_at

    @property
    def delivery_type(self) -> str:
        """The type whose queue its delivery came from."""
        return self.job.type if self.handed_type is None else self.handed_type
