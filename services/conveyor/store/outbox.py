"""The outbox: rows the relay publishes to RabbitMQ, and the NOTIFY that wakes it."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Connection, Statements
from .registry import statement
from .rows import OutboxRow

# The relay takes a batch in one statement: the rows are deleted inside the relay's open
# transaction, which commits only after every publish is confirmed. A crash before the commit
# rolls the delete back (the rows are published again: duplicates, never losses); rows whose
# publish failed are put back with ``outbox_restore`` before the commit. Rows of job types
# (``$2``) and retry pens (``$3``) whose declaration the broker refuses stay where they are
# meanwhile (see ``broker/publish.py``). ``id = ANY(ARRAY(…))``, not ``id IN (…)``: the semi-join
# hashed the taken ids and read the whole outbox to find them, a sequential scan per batch that
# made draining a backlog of millions quadratic.
_TAKE_BATCH = """
DELETE FROM __schema__.job_outbox
WHERE id = ANY(ARRAY(
    SELECT id FROM __schema__.job_outbox
    WHERE job_type <> ALL($2::text[])
      AND (destination <> 'retry' OR delay_seconds <> ALL($3::int4[]))
    ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
))
RETURNING id, job_id, job_type, priority, destination, delay_seconds, error, attempt
"""
OUTBOX_TAKE_BATCH = statement("outbox_take_batch", _TAKE_BATCH)
# Tracing on (``core/tracing.py``): the same, with each job's trace context (a primary-key
# lookup per row, paid only by a relay that traces), so every message a job ever gets (work,
# retry, redrive, reconciler) carries its ``traceparent``.
OUTBOX_TAKE_BATCH_TRACED = statement(
    "outbox_take_batch_traced",
    _TAKE_BATCH.rstrip()
    + """,
          (SELECT j.trace_context FROM __schema__.jobs j WHERE j.id = job_id) AS trace_context
""",
)

OUTBOX_RESTORE = statement(
    "outbox_restore",
    """
INSERT INTO __schema__.job_outbox (id, job_id, job_type, priority, destination, delay_seconds,
                                   error, attempt)
SELECT * FROM unnest($1::int8[], $2::uuid[], $3::text[], $4::int2[], $5::text[], $6::int4[],
                     $7::text[], $8::int4[])
""",
)

# Rows a relay holds: of the outbox's oldest ``$1`` rows (a relay takes the oldest first, so a
# batch it never commits stays at the head), those another transaction has locked (deleted, not
# committed). ``FOR KEY SHARE SKIP LOCKED`` skips exactly those, and holds its own lock only for
# this statement (a relay's ``FOR UPDATE SKIP LOCKED`` passes over them meanwhile); it needs
# UPDATE on the table, as the relay's own lock does (``roles.py``).
OUTBOX_HELD_IDS = statement(
    "outbox_held_ids",
    """
WITH head AS MATERIALIZED (
    SELECT id FROM __schema__.job_outbox ORDER BY id LIMIT $1
), free AS MATERIALIZED (
    SELECT id FROM __schema__.job_outbox WHERE id = ANY(ARRAY(SELECT id FROM head))
    FOR KEY SHARE SKIP LOCKED
)
SELECT id FROM head WHERE id <> ALL(ARRAY(SELECT id FROM free)) ORDER BY id
""",
)
# A copy, under a new id, of each of the rows ``$1`` that is still held (the relay holding it
# may have committed its delete or lost its session meanwhile): the copy is free for any relay.
OUTBOX_REQUEUE_HELD = statement(
    "outbox_requeue_held",
    """
WITH free AS MATERIALIZED (
    SELECT id FROM __schema__.job_outbox WHERE id = ANY($1::int8[]) FOR KEY SHARE SKIP LOCKED
), copied AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds,
                                       error, attempt)
    SELECT job_id, job_type, priority, destination, delay_seconds, error, attempt
    FROM __schema__.job_outbox
    WHERE id = ANY($1::int8[]) AND id <> ALL(ARRAY(SELECT id FROM free))
    ORDER BY id
    RETURNING job_id
)
SELECT count(*) FROM copied
""",
)

# The channel is per schema (``<schema>_outbox``), so two installs in one database do not wake
# each other's publishers.
OUTBOX_NOTIFY = statement("outbox_notify", "SELECT pg_notify('__schema___outbox', '')")


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
        await conn.execute(
            self.sql[OUTBOX_RESTORE],
            [r.id for r in rows],
            [r.job_id for r in rows],
            [r.job_type for r in rows],
            [r.priority for r in rows],
            [r.destination for r in rows],
            [r.delay_seconds for r in rows],
            [r.error for r in rows],
            [r.attempt for r in rows],
        )

    async def outbox_held_ids(self, conn: Connection, *, limit: int) -> list[int]:
        """Ids of the oldest ``limit`` rows that another transaction holds locked."""
        return [r["id"] for r in await conn.fetch(self.sql[OUTBOX_HELD_IDS], limit)]

    async def outbox_requeue_held(self, conn: Connection, ids: Sequence[int]) -> int:
        """Copy those of ``ids`` still held to new rows; returns how many."""
        return int(await conn.fetchval(self.sql[OUTBOX_REQUEUE_HELD], list(ids)))

    async def outbox_notify(self, conn: Connection) -> None:
        """Wake the publishers when the surrounding transaction commits (see ``notify.py``)."""
        await conn.execute(self.sql[OUTBOX_NOTIFY])
