"""SIGTERM: stop taking messages, let running jobs finish within the grace, hand back the rest
(PENDING again, no retry consumed), write every outcome, close. KEDA may scale a worker in at any
moment: nothing is lost, the exit code is 0. Work given up on (past its timeout +
``worker_overrun_limit``, still running, see ``executor.py``) is neither waited for nor handed
back: its job stays IN_PROGRESS until the process has exited and its lease runs out, so its retry
never runs beside it.

Each phase is a step of its own, in order: ``stop_taking`` → ``finish`` → ``hand_back`` →
``flush``. Handler threads still running afterwards are daemon threads: their jobs were handed
back (a late write is fenced) and they do not hold the process open.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

from ..broker.consume import Subscription
from .consumer import Consumer
from .executor import Executor
from .running import Running


@dataclass(frozen=True, slots=True)
class DrainStatus:
    phase: str  # "running", "stopping", "finishing", "handing_back", "flushing", "stopped"
    handed_back_waiting: int  # deliveries returned to the queue unclaimed
    handed_back_running: int  # running jobs handed back at the end of the grace


class Drain:
    """The worker's parts a drain stops: ``running`` is the worker's attempts in hand, ``idle``
    is set when the last one's outcome is written."""

    def __init__(
        self,
        consumer: Consumer,
        subscription: Subscription,
        executor: Executor,
        running: Mapping[uuid.UUID, Running],
        idle: asyncio.Event,
    ) -> None:
        self.consumer = consumer
        self.subscription = subscription
        self.executor = executor
        self.running = running
        self.idle = idle
        self.phase = "running"
        self.waiting = 0
        self.released = 0

    def status(self) -> DrainStatus:
        return DrainStatus(self.phase, self.waiting, self.released)

    async def run(self, grace: float, claim_loop: asyncio.Task[None] | None) -> None:
        await self.stop_taking(claim_loop)
        await self.finish(grace)
        await self.hand_back()
        await self.flush()
        self.phase = "stopped"

    async def stop_taking(self, claim_loop: asyncio.Task[None] | None) -> None:
        """Cancel the consumers and the consumer's loop (``claim_loop``); let a claim in flight
        end; return waiting deliveries."""
        self.phase = "stopping"
        self.consumer.stopping = True
        await quietly(self.subscription.cancel())
        if claim_loop is not None:
            claim_loop.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await claim_loop
        current = self.consumer.current
        if current is not None and not current.done():
            await quietly(asyncio.shield(current), 10)
        self.waiting = await self.consumer.hand_back_waiting()

    async def finish(self, grace: float) -> None:
        """Let running handlers finish within ``grace`` seconds."""
        self.phase = "finishing"
        if tasks := list(self.executor.tasks):
            await asyncio.wait(tasks, timeout=grace)

    async def hand_back(self) -> None:
        """Cancel what still runs: each reports RELEASE (handed back, no retry consumed)."""
        self.phase = "handing_back"
        self.released = self.executor.hand_back_all()
        if tasks := list(self.executor.tasks):
            await asyncio.wait(tasks, timeout=5)

    async def flush(self, timeout: float = 15.0) -> None:
        """Wait until every outcome is written (bounded: a database that is down must not hang
        the drain; the leases of unwritten attempts then expire and the sweeper recovers them)."""
        self.phase = "flushing"
        if any(r.given_up_at is None for r in self.running.values()):
            self.idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), timeout)


async def quietly(aw: Awaitable[Any], timeout: float = 5.0) -> None:
    """Best effort during shutdown: a broker or database that is down must not hang a drain."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(aw, timeout)
