"""Waking the publishers.

``pg_notify`` takes a database-wide lock that is held until the notifying transaction's commit
is flushed, so a NOTIFY inside every submit transaction serialises concurrent submits. The API
therefore notifies *after* its commits, from one background task that coalesces: however many
submits commit while a notification is in flight, one more follows. The worker's completer
(retries, dead letters, hand-backs) and the sweeper (promotions, lease recoveries, re-publishes)
use a ``Notifier`` of their own the same way, and ``conveyor dlq redrive`` notifies once after
its commit; only transactional ``enqueue``, on the application's transaction, notifies inside it.
The relay also polls (``CONVEYOR_RELAY_POLL_INTERVAL``), so a lost notification only costs
latency.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from . import Store


class Notifier:
    def __init__(self, pool: Any, store: Store) -> None:
        self.pool = pool
        self.store = store
        self._pending = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="outbox-notifier")

    def wake(self) -> None:
        self._pending.set()

    async def _run(self) -> None:
        while True:
            await self._pending.wait()
            self._pending.clear()
            try:
                async with self.pool.acquire() as conn:
                    await self.store.outbox_notify(conn)
            except Exception:
                await asyncio.sleep(0.1)  # the relay's poll covers the gap

    async def stop(self) -> None:
        """Stop; a notification still pending is sent (best effort) first."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            if self._pending.is_set():
                self._pending.clear()
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2), self.pool.acquire() as conn:
                        await self.store.outbox_notify(conn)
