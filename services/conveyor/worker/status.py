"""The worker's status: each part's small public status, as ``Worker.status()`` gathers them for
the health checks (``health.py`` reads that and the loop monitor, never private fields)."""

from __future__ import annotations

from dataclasses import dataclass

from ..broker.acks import AckStatus
from .completer import CompleterStatus
from .consumer import ConsumerStatus
from .drain import DrainStatus
from .executor import ExecutorStatus
from .guard import GuardStatus
from .heartbeater import HeartbeatStatus
from .loop import LoopStatus


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    worker_id: str
    concurrency: int
    running: int
    stopping: bool
    broker_connected: bool
    consuming: bool
    dead_parts: list[str]  # internal loops that ended: a wedged worker
    consumer: ConsumerStatus
    executor: ExecutorStatus
    completer: CompleterStatus
    heartbeat: HeartbeatStatus
    loop: LoopStatus
    guard: GuardStatus
    acks: AckStatus
    drain: DrainStatus
