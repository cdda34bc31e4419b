"""Every SQL statement of Conveyor, by name. Statements live in ``store/sql/*.sql`` (package
data), one file per concern, as named blocks::

    -- name: api_key_get
    -- Optional comment lines right under the name: the statement's documentation.
    SELECT ... FROM __schema__.api_keys WHERE key_id = $1

A block ends where the next ``-- name:`` line starts. ``-- name: database_exists catalog``
marks a statement that reads only PostgreSQL's catalogs (it names no Conveyor schema).
``-- name: job_claimable fragment`` marks a piece of SQL several statements share (a condition
written once): it is no statement, and a block of any file writes ``{{job_claimable}}`` where
its text goes (an unknown fragment fails at import; a fragment may include another). A
statement with more than a few parameters names them (``:job_id``); the loader turns them into
``$1``, ``$2``... once, in order of first use, and records the order (``PARAMS``): its call site
passes keywords through ``bind``, which refuses a missing or an extra name. A block uses
either ``$n`` or ``:name``, never both.

Statements are written with the placeholder ``__schema__`` before each table and type
(``__schema__.jobs``, ``::__schema__.job_status``) and rendered once per schema by ``render``:
each statement is fully schema-qualified, so it runs the same on Conveyor's own pools, on an
application's connection (whose ``search_path`` is the application's) and through PgBouncer in
transaction pooling (where a ``search_path`` startup parameter does not apply). Modules name the
statements they run with ``named(...)``, which fails at import for a name no file holds;
``tests/integration/test_schema.py`` prepares every one of them."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

PLACEHOLDER = "__schema__"
SCHEMA_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
_SCHEMA_RE = re.compile(SCHEMA_PATTERN)

TEMPLATES: dict[str, str] = {}
# The parameter names of a statement written with ``:name`` placeholders, in ``$n`` order.
PARAMS: dict[str, tuple[str, ...]] = {}
# The comment lines under a block's name line, and the file it came from.
DOCS: dict[str, str] = {}
SOURCES: dict[str, str] = {}
# The shared pieces (``fragment`` blocks) by name.
FRAGMENTS: dict[str, str] = {}

_NAME_LINE = re.compile(
    r"^--\s*name:\s*(?P<name>[a-z][a-z0-9_]*)(?:\s+(?P<flag>catalog|fragment))?\s*$"
)
# A quoted literal or identifier, a comment, a cast (``::``), a ``:name``, a ``$n`` or an
# ``{{include}}`` of a fragment.
_TOKENS = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|::|:(?P<named>[a-z_][a-z0-9_]*)|\$(?P<num>\d+)"
    r"|\{\{(?P<include>[a-z][a-z0-9_]*)\}\}"
)


def statement(name: str, sql: str, *, catalog: bool = False) -> str:
    """Register a statement template under ``name`` (``<entity>_<verb>``); returns the name.
    ``catalog``: it reads only PostgreSQL's catalogs, so it names no Conveyor schema."""
    if name in TEMPLATES:
        raise ValueError(f"statement {name} registered twice")
    if PLACEHOLDER not in sql and "FROM" in sql.upper() and not catalog:
        raise ValueError(f"statement {name} names no schema")
    TEMPLATES[name] = sql
    return name


def named(name: str) -> str:
    """The name of a statement held by a ``.sql`` file; raises at import for an unknown one."""
    if name not in TEMPLATES:
        raise LookupError(f"no statement {name} in store/sql/*.sql")
    return name


def bind(name: str, values: dict[str, Any]) -> list[Any]:
    """The positional arguments of a statement with named parameters, from ``values``."""
    order = PARAMS[name]
    if values.keys() != set(order):
        missing, extra = set(order) - values.keys(), values.keys() - set(order)
        raise TypeError(f"{name}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    return [values[p] for p in order]


def _numbered(name: str, body: str) -> tuple[str, tuple[str, ...]]:
    """``body`` with ``:name`` parameters turned into ``$n``, and the names in order."""
    order: list[str] = []
    numbered = False

    def one(m: re.Match[str]) -> str:
        nonlocal numbered
        if m["num"] is not None:
            numbered = True
        if m["named"] is None:
            return m[0]
        if m["named"] not in order:
            order.append(m["named"])
        return f"${order.index(m['named']) + 1}"

    out = _TOKENS.sub(one, _included(name, body))
    if order and numbered:
        raise ValueError(f"statement {name} mixes $n and :name parameters")
    return out, tuple(order)


def _included(name: str, body: str, within: tuple[str, ...] = ()) -> str:
    """``body`` with each ``{{fragment}}`` replaced by that fragment's text (a fragment may
    include others, never itself)."""

    def one(m: re.Match[str]) -> str:
        include = m["include"]
        if include is None:
            return m[0]
        if include not in FRAGMENTS:
            raise LookupError(f"statement {name} includes an unknown fragment {include}")
        if include in within:
            raise ValueError(f"fragment {include} includes itself ({' -> '.join(within)})")
        return _included(name, FRAGMENTS[include], (*within, include))

    return _TOKENS.sub(one, body)


def parse(text: str, source: str) -> Iterator[tuple[str, str, str, str | None]]:
    """(name, sql, documentation, flag: ``catalog``, ``fragment`` or None) for each block of one
    ``.sql`` file."""
    blocks: list[tuple[re.Match[str], list[str]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        m = _NAME_LINE.match(line)
        if m:
            blocks.append((m, []))
        elif line.startswith("-- name"):
            raise ValueError(f"{source}:{number}: malformed name line {line!r}")
        elif blocks:
            blocks[-1][1].append(line)
        elif line.strip() and not line.startswith("--"):
            raise ValueError(f"{source}:{number}: SQL before the first '-- name:' line")
    for m, lines in blocks:
        doc = []
        while lines and lines[0].startswith("--"):
            doc.append(lines.pop(0).removeprefix("--").strip())
        sql = "\n".join(lines).strip()
        if not sql:
            raise ValueError(f"{source}: statement {m['name']} is empty")
        yield m["name"], "\n" + sql + "\n", "\n".join(doc), m["flag"]


def load(files: dict[str, str]) -> None:
    """Register every block of ``files`` (file name -> text), the fragments first; a name twice
    raises."""
    blocks = [(s, *b) for s, text in sorted(files.items()) for b in parse(text, s)]
    for _, name, sql, _, flag in blocks:
        if flag == "fragment":
            if name in FRAGMENTS:
                raise ValueError(f"fragment {name} defined twice")
            FRAGMENTS[name] = sql.strip()
    for source, name, sql, doc, flag in blocks:
        if flag != "fragment":
            body, order = _numbered(name, sql)
            statement(name, body, catalog=flag == "catalog")
            if order:
                PARAMS[name] = order
            DOCS[name], SOURCES[name] = doc, source


def _package_files() -> dict[str, str]:
    folder = resources.files("conveyor.store") / "sql"
    return {f.name: f.read_text("utf-8") for f in folder.iterdir() if f.name.endswith(".sql")}


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


load(_package_files())
