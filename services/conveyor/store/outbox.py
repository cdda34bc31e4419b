"""The outbox: rows the relay publishes to RabbitMQ, and the NOTIFY that wakes it."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Connection, Statements
from .registry import bind, named
from .rows import OutboxRow

OUTBOX_TAKE_BATCH = named("outbox_take_batch")
OUTBOX_TAKE_BATCH_TRACED = named("outbox_take_batch_traced")
OUTBOX_RESTORE = named("outbox_restore")
OUTBOX_DELETE_CONFIRMED = named("outbox_delete_confirmed")
OUTBOX_HELD_IDS = named("outbox_held_ids")
OUTBOX_REQUEUE_HELD = named("outbox_requeue_held")
OUTBOX_NOTIFY = named("outbox_notify")
OUTBOX_WATCH = named("outbox_watch")


def _by_id(row: OutboxRow) -> int:
    return row.id


class OutboxStatements(Statements):
    async def outbox_take_batch(
        self,
        conn: Connection,
        *,
        limit: int,
        skip_types: Sequence[str] = (),
        skip_pens: Sequence[int] = (),
        traced: bool = False,
    ) -> list[OutboxRow]:
        """Delete and return up to ``limit`` rows, oldest first (call inside a transaction),
        leaving alone the rows of ``skip_types`` and the retries into ``skip_pens``.
        ``traced``: with each job's ``trace_context``."""
        sql = self.sql[OUTBOX_TAKE_BATCH_TRACED if traced else OUTBOX_TAKE_BATCH]
        rows = await conn.fetch(sql, limit, list(skip_types), list(skip_pens))
        return sorted((OutboxRow.from_record(r, traced=traced) for r in rows), key=_by_id)

    async def outbox_restore(self, conn: Connection, rows: Sequence[OutboxRow]) -> None:
        """Put back rows taken by ``outbox_take_batch`` whose publish failed."""
        values = {
            "id": [r.id for r in rows],
            "job_id": [r.job_id for r in rows],
            "job_type": [r.job_type for r in rows],
            "priority": [r.priority for r in rows],
            "destination": [r.destination for r in rows],
            "delay_seconds": [r.delay_seconds for r in rows],
            "error": [r.error for r in rows],
            "attempt": [r.attempt for r in rows],
        }
        await conn.execute(self.sql[OUTBOX_RESTORE], *bind(OUTBOX_RESTORE, values))

    async def outbox_delete_confirmed(self, conn: Connection, ids: Sequence[int]) -> None:
        """Delete rows put back whose messages the broker confirmed afterwards."""
        await conn.execute(self.sql[OUTBOX_DELETE_CONFIRMED], list(ids))

    async def outbox_held_ids(self, conn: Connection, *, limit: int) -> list[int]:
        """Ids of the oldest ``limit`` rows that another transaction holds locked."""
        return [r["id"] for r in await conn.fetch(self.sql[OUTBOX_HELD_IDS], limit)]

    async def outbox_requeue_held(self, conn: Connection, ids: Sequence[int]) -> int:
        """Copy those of ``ids`` still held to new rows; returns how many."""
        return int(await conn.fetchval(self.sql[OUTBOX_REQUEUE_HELD], list(ids)))

    async def outbox_notify(self, conn: Connection) -> None:
        """Wake the publishers when the surrounding transaction commits (see ``notify.py``)."""
        await conn.execute(self.sql[OUTBOX_NOTIFY])

    async def outbox_watch(self, conn: Connection) -> tuple[float | None, int]:
        """The oldest row's age in seconds (None: the outbox is empty) and the number of relay
        sessions connected to the database."""
        row = await conn.fetchrow(self.sql[OUTBOX_WATCH])
        return row["oldest"], int(row["relays"])
