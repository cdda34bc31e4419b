"""The admission duty: jobs of limited or partitioned types wait in PostgreSQL (WAITING, no
outbox row) until ``admit`` (``store/sql/schema/admission.sql``) makes them PENDING with their
outbox rows, one type at a time, keys in turn, within every limit. A worker's outcome admits the
next jobs of the types it freed slots of in its own transaction (``worker/completer.py``); this
duty's pass, every ``admission_interval`` seconds (0.05), admits the rest: new jobs, places in
the window freed by claims, retries and rate windows coming due. An idle pass is one probe of an
empty index.

Each pass of a type is one statement, so an admitter frozen or killed mid-pass holds nothing:
the server finishes the statement (and commits it) or rolls it back; the next admitter, in this
process or another, counts the slots again from the jobs. Any number of admitters may run:
``admit`` serialises them per type with a transaction-level advisory lock."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..core.config import Settings
from ..core.logging import event
from ..core.metrics import Metrics
from ..store import Store

log = logging.getLogger("conveyor.admission")

GAUGE_INTERVAL = 5.0  # seconds between two computations of the admissible gauge


class Admitter:
    def __init__(self, settings: Settings, store: Store, metrics: Metrics, pool: Any) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.pool = pool
        self._gauged = 0.0
        self._gauge_types: set[str] = set()

    async def step(self) -> int:
        """One pass: admit what may start of every type with waiting jobs. Returns how many
        jobs it admitted."""
        async with self.pool.acquire() as conn:
            types = await self.store.admission_types(conn)
            admitted = 0
            for job_type in types:
                n = await self.store.admit(conn, job_type, self.settings.admission_window)
                if n:
                    self.metrics.jobs_admitted.labels(job_type).inc(n)
                    event(log, "jobs_admitted", logging.DEBUG, type=job_type, n=n)
                admitted += n
            if time.monotonic() - self._gauged >= GAUGE_INTERVAL:
                await self._gauge(conn, types)
        return admitted

    async def _gauge(self, conn: Any, types: list[str]) -> None:
        """``conveyor_jobs_admissible{type}``: what the limits would admit if the fleet had
        room (the window left out), for the types with waiting jobs; 0 for the others."""
        self._gauged = time.monotonic()
        for job_type in types:
            n = await self.store.admit(conn, job_type, 0, dry=True)
            self.metrics.jobs_admissible.labels(job_type).set(n)
        for gone in self._gauge_types - set(types):
            self.metrics.jobs_admissible.labels(gone).set(0)
        self._gauge_types = set(types)
