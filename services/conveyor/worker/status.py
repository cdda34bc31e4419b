"""The worker's status: each part's small public status, gathered for the health checks
(``health.py`` reads ``Worker.status()`` / the loop monitor's snapshot, never private fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..broker.acks import AckStatus
from .completer import CompleterStatus
from .consumer import ConsumerStatus
from .drain import DrainStatus
from .executor import ExecutorStatus
from .guard import GuardStatus
from .heartbeater import HeartbeatStatus
from .loop import LoopStatus

if TYPE_CHECKING:
    from .worker import Worker


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


def gather_status(w: Worker) -> WorkerStatus:
    dead = [name for name, t in w.loops.items() if t.done()]
    return WorkerStatus(
        worker_id=w.worker_id,
        concurrency=w.concurrency,
        running=len(w.running),
        stopping=w.stopping,
        broker_connected=w.subscription.connected,
        consuming=w.subscription.consuming,
        dead_parts=[] if w.stopping else dead,
        consumer=w.consumer.status(),
        executor=w.executor.status(),
        completer=w.completer.status(),
        heartbeat=w.heartbeater.status(),
        loop=w.monitor.status(),
        guard=w.guard.status(),
        acks=w.acks.status(),
        drain=w.drain.status(),
    )
