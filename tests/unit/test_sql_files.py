"""The store's SQL lives in named blocks of ``store/sql/*.sql``: the loader's parsing, the
translation of named parameters, the checks that fail at import, and that every block is run
by some module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import conveyor.store  # noqa: F401 - registers every statement
from conveyor.store import registry
from conveyor.store.stats import COUNTED_STATUSES

STORE = Path(registry.__file__).parent


def test_blocks_parse_with_their_documentation() -> None:
    text = "-- a file comment\n\n-- name: a_get\n-- The doc.\n-- More.\nSELECT 1\n  -- kept\n\n" \
        "-- name: b_get catalog\nSELECT 2\n"  # fmt: skip
    blocks = list(registry.parse(text, "t.sql"))
    assert blocks == [
        ("a_get", "\nSELECT 1\n  -- kept\n", "The doc.\nMore.", None),
        ("b_get", "\nSELECT 2\n", "", "catalog"),
    ]


@pytest.mark.parametrize(
    "text",
    ["SELECT 1\n-- name: a_get\nSELECT 2", "-- name: A-get\nSELECT 1", "-- name: a_get\n-- doc"],
)
def test_malformed_files_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        list(registry.parse(text, "t.sql"))


def test_named_parameters_become_numbered_in_order_of_first_use() -> None:
    sql = (
        "SELECT :b::int, ':a' AS lit, \":a\" AS ident, x::text, :a, :b -- :c\n"
        "FROM t WHERE y = :a::__schema__.job_status"
    )
    out, order = registry._numbered("n", sql)
    assert order == ("b", "a")
    assert out == (
        "SELECT $1::int, ':a' AS lit, \":a\" AS ident, x::text, $2, $1 -- :c\n"
        "FROM t WHERE y = $2::__schema__.job_status"
    )
    assert registry._numbered("n", "SELECT $1::int")[1] == ()
    with pytest.raises(ValueError, match="mixes"):
        registry._numbered("n", "SELECT $1, :a")


def test_a_fragment_is_included_where_a_statement_names_it() -> None:
    claim = registry.TEMPLATES["job_claim_many"]
    assert registry.FRAGMENTS["job_claimable"] in claim and "{{" not in claim
    assert "job_claimable" not in registry.TEMPLATES
    out, order = registry._numbered("n", "SELECT '{{job_claimable}}', :a WHERE {{job_claimable}}")
    assert out == f"SELECT '{{{{job_claimable}}}}', $1 WHERE {registry.FRAGMENTS['job_claimable']}"
    assert order == ("a",)
    with pytest.raises(LookupError, match="unknown fragment nope"):
        registry._numbered("n", "SELECT 1 WHERE {{nope}}")
    with pytest.raises(ValueError, match="fragment job_claimable defined twice"):
        registry.load({"again.sql": "-- name: job_claimable fragment\ntrue"})
    sources = [p.read_text() for p in (STORE / "sql").glob("*.sql")]
    assert all(any("{{" + f + "}}" in text for text in sources) for f in registry.FRAGMENTS)


def test_a_name_twice_or_an_unknown_name_fails() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        registry.load({"again.sql": "-- name: job_get\nSELECT 1"})
    with pytest.raises(LookupError, match="no statement job_gett"):
        registry.named("job_gett")
    with pytest.raises(ValueError, match="names no schema"):
        registry.load({"t.sql": "-- name: zz_unqualified\nSELECT id FROM jobs"})


def test_bind_refuses_a_missing_or_an_extra_name() -> None:
    name = "job_page"
    values = {"job_type": "t", "status": None, "before": None, "since": None, "limit": 5}
    args = registry.bind(name, values)
    assert args == [values[p] for p in registry.PARAMS[name]]
    assert sorted(registry.PARAMS[name]) == sorted(values)
    with pytest.raises(TypeError, match=r"missing \['limit'\]"):
        registry.bind(name, {k: v for k, v in values.items() if k != "limit"})
    with pytest.raises(TypeError, match=r"unexpected \['lmit'\]"):
        registry.bind(name, {**values, "lmit": 5})


def test_every_block_is_run_by_a_module_and_every_file_is_loaded() -> None:
    used = set()
    for path in STORE.glob("*.py"):
        used |= set(re.findall(r'named\(\s*"(\w+)"\s*\)', path.read_text()))
    from_files = {n for n, source in registry.SOURCES.items()}
    assert from_files - used == set()
    assert {p.name for p in (STORE / "sql").glob("*.sql")} == set(registry.SOURCES.values())


def test_the_capped_counts_have_one_branch_per_counted_status() -> None:
    sql = registry.TEMPLATES["job_counts_capped"]
    assert re.findall(r"'(\w+)'::text AS status", sql) == list(COUNTED_STATUSES)
