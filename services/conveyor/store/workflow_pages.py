"""Workflows as their readers see them: ``GET /workflows`` pages (also the CLI's and the
dashboard's), the Idempotency-Key of ``POST /workflows``, and the counts of the gauges."""

from __future__ import annotations

import uuid

import orjson

from .base import Connection, Statements
from .registry import bind, named
from .workflows import WorkflowRow

WORKFLOW_PAGE = named("workflow_page")
WORKFLOW_PAGE_BY_STATUS = named("workflow_page_by_status")
WORKFLOW_PAGE_BY_NAME = named("workflow_page_by_name")
WORKFLOW_BY_IDEMPOTENCY_KEY = named("workflow_by_idempotency_key")
WORKFLOW_SET_IDEMPOTENCY_KEY = named("workflow_set_idempotency_key")
WORKFLOW_STATUS_COUNTS = named("workflow_status_counts")
WORKFLOW_COUNT_ESTIMATE = named("workflow_count_estimate")


def page_statement(status: str | None, name: str | None) -> str:
    """The ``workflow_page*`` statement of a filter: by name when a name is given (names are
    the narrower filter), else by status, else none."""
    if name is not None:
        return WORKFLOW_PAGE_BY_NAME
    return WORKFLOW_PAGE if status is None else WORKFLOW_PAGE_BY_STATUS


class WorkflowPageStatements(Statements):
    async def workflow_page(
        self,
        conn: Connection,
        *,
        status: str | None,
        name: str | None,
        before: uuid.UUID | None,
        limit: int,
    ) -> list[WorkflowRow]:
        """Newest first, ids below ``before`` (the keyset cursor)."""
        statement = page_statement(status, name)
        values = {"status": status, "name": name, "before": before, "limit": limit}
        if statement == WORKFLOW_PAGE:
            del values["status"], values["name"]
        elif statement == WORKFLOW_PAGE_BY_STATUS:
            del values["name"]
        rows = await conn.fetch(self.sql[statement], *bind(statement, values))
        return [WorkflowRow(*r.values()) for r in rows]

    async def workflow_by_idempotency_key(
        self, conn: Connection, key: str
    ) -> tuple[uuid.UUID, str | None] | None:
        """(id, request hash) of the workflow submitted with ``key``."""
        row = await conn.fetchrow(self.sql[WORKFLOW_BY_IDEMPOTENCY_KEY], key)
        return None if row is None else (row["id"], row["request_hash"])

    async def workflow_set_idempotency_key(
        self, conn: Connection, workflow_id: uuid.UUID, key: str, request_hash: str
    ) -> None:
        """Raises asyncpg's ``UniqueViolationError`` when another workflow holds ``key``."""
        await conn.execute(self.sql[WORKFLOW_SET_IDEMPOTENCY_KEY], workflow_id, key, request_hash)

    async def workflow_status_counts(self, conn: Connection, cap: int) -> dict[str, int]:
        """Workflows by status, each count stopped at ``cap``."""
        rows = await conn.fetch(self.sql[WORKFLOW_STATUS_COUNTS], cap)
        return {r["status"]: int(r["n"]) for r in rows}

    async def workflow_count_estimate(self, conn: Connection, status: str) -> int:
        """The planner's estimate of the workflows in ``status``."""
        plan = await conn.fetchval(self.sql[WORKFLOW_COUNT_ESTIMATE], status)
        return int(orjson.loads(plan)[0]["Plan"]["Plan Rows"])
