"""The schema: every table, index, function, trigger and view of an install, in the files of
``store/sql/schema/`` (read them to know the database). The baseline migration creates what they
describe; ``tests/integration/test_schema.py`` builds a database from the migrations and one
from these files and compares their catalogs, so the two never drift. Everything lives in one
PostgreSQL schema, ``CONVEYOR_DB_SCHEMA`` (default ``conveyor``), beside the application's own
tables; so does Alembic's version table. The files write ``__schema__`` before each name, as the
named statements do (``registry.py``)."""

from __future__ import annotations

from importlib import resources

from .registry import PLACEHOLDER, check_schema

DEFAULT_SCHEMA = "conveyor"
VERSION_TABLE = "alembic_version"
# in the order they are run: each file uses only what the ones before it create
SCHEMA_FILES = ("jobs", "controls", "workflows", "admission", "operator")
WORKFLOW_STATUSES = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED")
ON_FAILURE = ("cancel", "continue")


def outbox_channel(schema: str) -> str:
    """The NOTIFY channel that wakes the publishers of the install in ``schema``."""
    return f"{schema}_outbox"


def schema_statements(schema: str = DEFAULT_SCHEMA) -> list[str]:
    """The statements that create an install in ``schema``, one by one, in order. A statement
    ends with a line ending in ``;`` outside a ``$fn$`` body."""
    check_schema(schema)
    folder = resources.files("conveyor.store").joinpath("sql", "schema")
    statements: list[str] = []
    for name in SCHEMA_FILES:
        text = folder.joinpath(f"{name}.sql").read_text("utf-8").replace(PLACEHOLDER, schema)
        lines: list[str] = []
        in_body = False
        for line in text.splitlines():
            lines.append(line)
            in_body ^= line.count("$fn$") % 2 == 1
            code = line.split("--", 1)[0].rstrip()
            if not in_body and code.endswith(";"):
                statements.append("\n".join(lines).strip())
                lines = []
        if "\n".join(lines).split("--", 1)[0].strip():
            raise ValueError(f"schema/{name}.sql ends inside a statement")
    return statements
