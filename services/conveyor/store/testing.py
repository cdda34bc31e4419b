"""Statements of ``conveyor.testing`` (users' own test suites): make due what a test drain
should run, pick the due jobs of a router's types, and list waiting jobs for assertions. Never
used by the services."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .attempts import claimable
from .base import Connection, Statements
from .jobs import JOB_COLUMNS
from .registry import statement
from .rows import JobRow

# A test drain does not wait for timers: SCHEDULED jobs that are due (all of them with ``$2``)
# become PENDING, and (``testing_skip_retry_delay``) RETRYING jobs waiting out their retry
# delay are due now.
# Nothing is published: the drain claims these rows itself.
TESTING_MAKE_DUE = statement(
    "testing_make_due",
    """
UPDATE __schema__.jobs SET
    status = 'PENDING'::__schema__.job_status,
    run_at = least(run_at, now()),
    updated_at = now()
WHERE array_position($1::text[], job_type) IS NOT NULL
  AND status = 'SCHEDULED' AND ($2 OR run_at <= now())
""",
)
TESTING_SKIP_RETRY_DELAY = statement(
    "testing_skip_retry_delay",
    """
UPDATE __schema__.jobs SET run_at = now(), updated_at = now()
WHERE array_position($1::text[], job_type) IS NOT NULL
  AND status = 'RETRYING' AND run_at > now()
""",
)

# The due jobs of the types, in the order workers favour: higher priority first, then oldest.
TESTING_DUE_IDS = statement(
    "testing_due_ids",
    f"""
SELECT id FROM __schema__.jobs
WHERE array_position($1::text[], job_type) IS NOT NULL AND {claimable()}
ORDER BY priority DESC, COALESCE(run_at, created_at), id
LIMIT $2
""",
)

# Waiting jobs (PENDING, SCHEDULED, RETRYING) of a type, or of all types; ``payload`` and
# ``meta`` match by containment (``@>``: the keys given, with those values); ``unique_key``
# matches the key a unique job holds (``unique_key=`` of a submit).
TESTING_WAITING = statement(
    "testing_waiting",
    f"""
SELECT {JOB_COLUMNS} FROM __schema__.jobs j
WHERE ($1::text IS NULL OR j.job_type = $1)
  AND j.status IN ('PENDING', 'SCHEDULED', 'RETRYING')
  AND ($2::jsonb IS NULL OR j.payload @> $2::jsonb)
  AND ($3::jsonb IS NULL OR COALESCE(j.meta, '{{}}'::jsonb) @> $3::jsonb)
  AND ($4::text IS NULL OR EXISTS (SELECT 1 FROM __schema__.job_uniques u
                                   WHERE u.key = j.job_type || '/key/' || $4
                                     AND u.job_id = j.id))
ORDER BY j.created_at, j.id
""",
)

TESTING_DROP_SCHEMA = statement("testing_drop_schema", "DROP SCHEMA IF EXISTS __schema__ CASCADE")


def _json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


class TestingStatements(Statements):
    async def testing_drop_schema(self, conn: Connection) -> None:
        """Drop this schema and everything in it (the test plugin's per-session schema)."""
        await conn.execute(self.sql[TESTING_DROP_SCHEMA])

    async def testing_make_due(
        self, conn: Connection, types: Sequence[str], *, skip_retry_delay: bool, scheduled: bool
    ) -> None:
        await conn.execute(self.sql[TESTING_MAKE_DUE], list(types), scheduled)
        if skip_retry_delay:
            await conn.execute(self.sql[TESTING_SKIP_RETRY_DELAY], list(types))

    async def testing_due_ids(
        self, conn: Connection, types: Sequence[str], *, limit: int
    ) -> list[uuid.UUID]:
        return [r["id"] for r in await conn.fetch(self.sql[TESTING_DUE_IDS], list(types), limit)]

    async def testing_waiting(
        self,
        conn: Connection,
        job_type: str | None,
        *,
        payload: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        unique_key: str | None = None,
    ) -> list[JobRow]:
        rows = await conn.fetch(
            self.sql[TESTING_WAITING], job_type, _json(payload), _json(meta), unique_key
        )
        return [JobRow.from_record(r) for r in rows]
