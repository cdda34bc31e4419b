"""Every SQL statement of Conveyor, by name. Statements are written once with the placeholder
``__schema__`` before each table and type (``__schema__.jobs``, ``::__schema__.job_status``) and
rendered once per schema by ``render``: each statement is fully schema-qualified, so it runs the
same on Conveyor's own pools, on an application's connection (whose ``search_path`` is the
application's) and through PgBouncer in transaction pooling (where a ``search_path`` startup
parameter does not apply). ``tests/integration/test_schema.py`` prepares every one of them."""

from __future__ import annotations

import functools
import re

PLACEHOLDER = "__schema__"
SCHEMA_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
_SCHEMA_RE = re.compile(SCHEMA_PATTERN)

TEMPLATES: dict[str, str] = {}


def statement(name: str, sql: str, *, catalog: bool = False) -> str:
    """Register a statement template under ``name`` (``<entity>_<verb>``); returns the name.
    ``catalog``: it reads only PostgreSQL's catalogs, so it names no Conveyor schema."""
    if name in TEMPLATES:
        raise ValueError(f"statement {name} registered twice")
    if PLACEHOLDER not in sql and "FROM" in sql.upper() and not catalog:
        raise ValueError(f"statement {name} names no schema")
    TEMPLATES[name] = sql
    return name


def check_schema(schema: str) -> str:
    """Schema names are plain lower-case identifiers, so they never need quoting."""
    if not _SCHEMA_RE.fullmatch(schema):
        raise ValueError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and underscores"
        )
    return schema


@functools.cache
def render(schema: str) -> dict[str, str]:
    """Every registered statement with ``schema`` filled in (computed once per schema)."""
    check_schema(schema)
    return {name: sql.replace(PLACEHOLDER, schema) for name, sql in TEMPLATES.items()}
