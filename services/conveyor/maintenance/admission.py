"""The admission duty: jobs of limited or partitioned types wait in PostgreSQL (WAITING, no
outbox row) until ``admit`` (``store/sql/schema/admission.sql``) makes them PENDING with their
outbox rows, one type at a time, keys in turn, within every limit. A pass runs when a job under
admission arrives or frees a slot (the jobs' triggers NOTIFY ``<schema>_admit``), and every
``admission_interval`` seconds while jobs wait (a retry's or a rate window's time comes).

Each pass of a type is one statement, so an admitter frozen or killed mid-pass holds nothing:
the server finishes the statement (and commits it) or rolls it back; the next admitter, in this
process or another, counts the slots again from the jobs. Any number of admitters may run:
``admit`` serialises them per type with a transaction-level advisory lock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ..core.config import Settings
from ..core.logging import event
from ..core.metrics import Metrics
from ..store import Store
from ..store.connect import listen, listen_url

log = logging.getLogger("conveyor.admission")

GAUGE_INTERVAL = 5.0  # seconds between two computations of the admissible gauge


def admit_channel(schema: str) -> str:
    """The NOTIFY channel that wakes the admitters of the install in ``schema``."""
    return f"{schema}_admit"


class Admitter:
    def __init__(self, settings: Settings, store: Store, metrics: Metrics, pool: Any) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.pool = pool
        self.wake = asyncio.Event()
        self._listener: Any = None
        self._gauged = 0.0
        self._gauge_types: set[str] = set()

    async def listen(self) -> None:
        """LISTEN on the admission channel when a session of its own is possible (else the
        interval alone drives the passes)."""
        s = self.settings
        url = listen_url(s.database_url, s.db_pooler, s.listen_database_url)
        if url is None or (self._listener is not None and not self._listener.is_closed()):
            return
        with contextlib.suppress(Exception):
            self._listener = await listen(
                url, admit_channel(s.db_schema), self.wake.set, name="conveyor-admission-listen"
            )

    async def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=2)
            self._listener = None

    async def step(self) -> int:
        """One pass: admit what may start of every type with waiting jobs. Returns how many
        jobs it admitted."""
        self.wake.clear()
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
