"""Who notices when nothing relays? Every ``conveyor api`` and ``conveyor worker`` process watches
the outbox: when its oldest row is older than ``outbox_stale_after`` (30 s) and no relay session is
connected to the database, jobs are accepted and never published, and nothing else would say so.
The process logs it once per episode (``outbox_unrelayed``, a warning; ``outbox_relayed_again``
when it ends) and reports it in its health details, without failing its liveness: restarting an
API or a worker would not bring a relay."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..core.logging import event
from ..store import Store

log = logging.getLogger("conveyor.outbox")

HINT = (
    "no relay is connected to the database: run `conveyor publisher`, or let this process run "
    "the relay (CONVEYOR_RUN_DUTIES=true, the default)"
)


class OutboxWatch:
    def __init__(
        self, store: Store, stale_after: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.stale_after = stale_after
        self.clock = clock
        self.oldest: float | None = None  # seconds, at the last look
        self.relays: int | None = None  # relay sessions connected, at the last look
        self.unrelayed = False  # an episode is on
        self.error: str | None = None
        self.checked_at: float | None = None

    async def step(self, conn: Any) -> None:
        """One look (on ``conn``); a change of episode is logged."""
        try:
            self.oldest, self.relays = await self.store.outbox_watch(conn)
        except Exception as exc:
            if self.error is None:  # once, until a look succeeds again
                event(log, "outbox_watch_failed", logging.WARNING, error=repr(exc)[:300])
            self.error = repr(exc)[:300]
            raise
        self.error = None
        self.checked_at = self.clock()
        stale = self.oldest is not None and self.oldest > self.stale_after
        unrelayed = stale and self.relays == 0
        if unrelayed and not self.unrelayed:
            event(
                log,
                "outbox_unrelayed",
                logging.WARNING,
                oldest_seconds=round(self.oldest or 0.0, 1),
                message=HINT,
            )
        elif self.unrelayed and not unrelayed:
            event(log, "outbox_relayed_again", relays=self.relays)
        self.unrelayed = unrelayed

    def details(self) -> dict[str, Any]:
        since = None if self.checked_at is None else round(self.clock() - self.checked_at, 1)
        return {
            "unrelayed": self.unrelayed,
            "oldest_seconds": None if self.oldest is None else round(self.oldest, 1),
            "relays_connected": self.relays,
            "stale_after": self.stale_after,
            "checked_seconds_ago": since,
            "error": self.error,
        }
