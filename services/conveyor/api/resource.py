"""The job resource as served: built from a decoded row in one pass, with ``last_error`` reduced
to its last line unless the caller may read tracebacks (see docs/api.md)."""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any, Protocol, TypeVar

from ..core.errors import InvalidJob
from ..store import JobRow

# The longest last_error line served (the full text stays in the database for operators).
SUMMARY_CHARS = 500


def error_summary(text: str | None) -> str | None:
    """The last non-empty line of a stored error: for a Python traceback, ``Type: message``,
    without the file paths and source lines above it."""
    if text is None:
        return None
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line:
            return line[:SUMMARY_CHARS]
    return ""


def resource(row: JobRow, *, tracebacks: bool = False) -> dict[str, Any]:
    """The job resource (``JobResource``'s fields) straight from a row."""
    return {
        "id": row.id,
        "type": row.job_type,
        "status": row.status,
        "priority": row.priority,
        "payload": row.payload,
        "result": row.result,
        "attempts": row.attempts,
        "retry_count": row.retry_count,
        "max_retries": row.max_retries,
        "timeout_seconds": row.timeout_seconds,
        "last_error": error_summary(row.last_error),
        "last_error_traceback": row.last_error if tracebacks else None,
        "cancel_requested": row.cancel_requested,
        "run_at": row.run_at,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "progress": row.progress,
        "meta": row.meta,
        "workflow_id": row.workflow_id,
        "depends_on": list(row.depends_on),
        "partition_key": row.partition_key or None,
        "waiting_for": row.waiting_for,
    }


class Keyed(Protocol):
    @property
    def id(self) -> uuid.UUID: ...


R = TypeVar("R", bound=Keyed)


def keyset_page(rows: list[R], limit: int) -> tuple[list[R], str | None]:
    """A keyset page from ``limit + 1`` rows fetched after the cursor: its ``limit`` rows, and
    the cursor of the next page (the last row's id), None when no row was left over."""
    if len(rows) <= limit:
        return rows, None
    return rows[:limit], base64.urlsafe_b64encode(rows[limit - 1].id.bytes).decode().rstrip("=")


def decode_cursor(cursor: str) -> uuid.UUID:
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error):
        raise InvalidJob("invalid cursor") from None
