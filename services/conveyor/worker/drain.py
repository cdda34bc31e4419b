"""SIGTERM: stop taking messages, let running jobs finish within the grace, hand back the rest
(PENDING again, no retry consumed), write every outcome, close. KEDA may scale a worker in at any
moment: nothing is lost, the exit code is 0.

Each phase is a step of its own, in order: ``stop_taking`` → ``finish`` → ``hand_back`` →
``flush``. Handler threads still running afterwards are daemon threads: their jobs were handed
back (a late write is fenced) and they do not hold the process open.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .worker import Worker


@dataclass(frozen=True, slots=True)
class DrainStatus:
    phase: str  # "running", "stopping", "finishing", "handing_back", "flushing", "stopped"
    handed_back_waiting: int  # deliveries returned to the queue unclaimed
    handed_back_running: int  # running jobs handed back at the end of the grace


class Drain:
    def __init__(self, worker: Worker, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.w = worker
        self.clock = clock
        self.phase = "running"
        self.waiting = 0
        self.released = 0

    def status(self) -> DrainStatus:
        return DrainStatus(self.phase, self.waiting, self.released)

    async def run(self, grace: float) -> None:
        await self.stop_taking()
        await self.finish(grace)
        await self.hand_back()
        await self.flush()
        self.phase = "stopped"

    async def stop_taking(self) -> None:
        """Cancel the consumers; let a claim in flight end; return waiting deliveries."""
        self.phase = "stopping"
        w = self.w
        w.consumer.stopping = True
        await _quietly(w.subscription.cancel())
        claim = w.loops.get("consumer")
        if claim is not None:
            claim.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await claim
        current = w.consumer.current
        if current is not None and not current.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(current), 10)
        self.waiting = await w.consumer.hand_back_waiting()

    async def finish(self, grace: float) -> None:
        """Let running handlers finish within ``grace`` seconds."""
        self.phase = "finishing"
        tasks = list(self.w.executor.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=grace)

    async def hand_back(self) -> None:
        """Cancel what still runs: each reports RELEASE (handed back, no retry consumed)."""
        self.phase = "handing_back"
        self.released = self.w.executor.hand_back_all()
        tasks = list(self.w.executor.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    async def flush(self, timeout: float = 15.0) -> None:
        """Wait until every outcome is written (bounded: a database that is down must not hang
        the drain; the leases of unwritten attempts then expire and the sweeper recovers them)."""
        self.phase = "flushing"
        if self.w.running:
            self.w.idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.w.idle.wait(), timeout)


async def _quietly(aw: Awaitable[Any], timeout: float = 5.0) -> None:
    """Best effort during shutdown: a broker or database that is down must not hang a drain."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(aw, timeout)
