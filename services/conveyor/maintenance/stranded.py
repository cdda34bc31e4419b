"""Outbox rows held by a relay that stopped: part of the reconciler's pass.

A relay deletes its batch's outbox rows and publishes them before it commits; frozen in
between (a paused VM, a partition, a lost host), it keeps the rows locked and uncommitted. They
still exist, so the reconciler's "no outbox row in flight" never counts their jobs, and the
other relays skip them. The session bound (``CONVEYOR_DB_IDLE_IN_TRANSACTION_TIMEOUT``) ends
such a session within seconds; this finds the rows when no bound does (set to 0, or a pooler
without the role settings). Like the reconciler, two passes: a row held at two consecutive
passes (``reconcile_interval`` apart, longer than a relay's publish wait) is copied to a new
row, which any relay takes; the frozen relay, should it resume, publishes its copy too: a
duplicate the worker's claim drops."""

from __future__ import annotations

import logging
from typing import Any

from ..core.logging import event
from ..store import Store

log = logging.getLogger("conveyor.sweeper")

# how far into the outbox's head a pass looks (a frozen relay's batch is the oldest rows)
HEAD = 2000


class StrandedOutbox:
    def __init__(self, store: Store, head: int = HEAD) -> None:
        self.store = store
        self.head = head
        self._suspects: set[int] = set()  # held at the last pass
        self._copied: set[int] = set()  # held rows already copied (while they stay held)

    async def step(self, pool: Any) -> int:
        """One pass: returns how many held rows were copied."""
        async with pool.acquire() as conn:
            held = set(await self.store.outbox_held_ids(conn, limit=self.head))
            self._copied &= held
            candidates = held - self._copied
            stranded = sorted(candidates & self._suspects)
            self._suspects = candidates - set(stranded)
            if not stranded:
                return 0
            n = await self.store.outbox_requeue_held(conn, stranded)
        self._copied.update(stranded)
        event(
            log,
            "outbox_rows_stranded",
            logging.WARNING,
            held=len(stranded),
            copied=n,
            first=stranded[0],
        )
        return n
