"""Progress reports (``job.set_progress``), written in batches: at most one write per job every
``interval`` seconds (the last value reported wins), fenced by the attempt that reported it.

Best effort by design: a report that cannot be written (database unreachable) is dropped with a
log line; the next report replaces it. The outcome of the attempt never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import uuid
from typing import Any

from ..core.logging import event
from ..store import Connection, ProgressReport, Store
from .outcomes import clean_text

log = logging.getLogger("conveyor.worker")

MAX_MESSAGE_CHARS = 1000


def report(job_id: uuid.UUID, attempt: int, percent: Any, message: Any) -> ProgressReport:
    """A checked report: ``percent`` a real number from 0 to 100, ``message`` text or None."""
    if isinstance(percent, bool) or not isinstance(percent, int | float):
        raise TypeError("percent must be a number from 0 to 100")
    if not math.isfinite(percent) or not 0 <= percent <= 100:
        raise ValueError("percent must be a number from 0 to 100")
    if message is not None and not isinstance(message, str):
        raise TypeError("message must be a string or None")
    text = None if message is None else clean_text(message, MAX_MESSAGE_CHARS)
    return ProgressReport(job_id, attempt, float(percent), text)


class ProgressWriter:
    def __init__(self, pool: Any, store: Store, *, interval: float = 0.5) -> None:
        self.pool = pool
        self.store = store
        self.interval = interval
        self._pending: dict[uuid.UUID, ProgressReport] = {}
        self._lock = threading.Lock()  # sync handlers report from their threads
        self.written_total = 0

    def put(self, r: ProgressReport) -> None:
        with self._lock:
            self._pending[r.job_id] = r

    def take(self, job_id: uuid.UUID) -> ProgressReport | None:
        """The attempt ended: its report not yet written goes with its outcome instead
        (``write_last``), so a finished job shows the last progress its handler reported."""
        if not self._pending:  # the usual case, without the lock: this attempt's handler has
            return None  # returned, so its own report (if any) is in the dict already
        with self._lock:
            return self._pending.pop(job_id, None)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush_once()

    async def flush_once(self) -> int:
        """One step: write every job's latest report in one statement. Returns how many."""
        with self._lock:
            batch, self._pending = list(self._pending.values()), {}
        if not batch:
            return 0
        try:
            async with self.pool.acquire() as conn:
                written = await self.store.job_progress_many(conn, batch)
        except Exception as exc:
            event(
                log,
                "progress_write_failed",
                logging.WARNING,
                error=repr(exc)[:300],
                count=len(batch),
            )
            return 0
        self.written_total += len(written)
        return len(batch)


async def write_last(store: Store, conn: Connection, reports: list[ProgressReport | None]) -> None:
    """In the outcome's transaction, before the outcome (the report is fenced on IN_PROGRESS):
    the reports ``take`` kept back. Costs nothing when there are none."""
    kept = [r for r in reports if r is not None]
    if kept:
        await store.job_progress_many(conn, kept)
