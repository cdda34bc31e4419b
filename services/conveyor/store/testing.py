"""Statements of ``conveyor.testing`` (applications' own test suites, ``sql/testing.sql``): make
due what a test drain should run, pick the due jobs of a router's types, list waiting jobs for
assertions. Never used by the services."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .base import Connection, Statements
from .registry import named
from .rows import JobRow

TESTING_MAKE_DUE = named("testing_make_due")
TESTING_SKIP_RETRY_DELAY = named("testing_skip_retry_delay")
TESTING_DUE_IDS = named("testing_due_ids")
TESTING_ADMIT = named("testing_admit")
TESTING_ADMIT_SCHEDULED = named("testing_admit_scheduled")
TESTING_WAITING = named("testing_waiting")
TESTING_DROP_SCHEMA = named("testing_drop_schema")


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
        if scheduled:
            await conn.execute(self.sql[TESTING_ADMIT_SCHEDULED], list(types))
        await conn.execute(self.sql[TESTING_ADMIT], list(types))

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
