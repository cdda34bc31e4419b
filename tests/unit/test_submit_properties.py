"""Property-based: the submit validator raises only documented errors, and what it
accepts it keeps unchanged."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from conveyor.api.batch import build_batch, build_submit
from conveyor.api.body import BodyError, TooManyJobs
from conveyor.core.errors import InvalidJob

DOCUMENTED = (BodyError, TooManyJobs, ValidationError, InvalidJob)
LIMIT = 4096

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["\\u0000", "\\\\u0000", "\U0001f600", "Infinity", "NaN"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
offsets = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
instants = st.datetimes(timezones=offsets)
anything = st.one_of(
    json_values,
    st.integers(),
    st.floats(),
    st.sampled_from([True, False, "30", "", "high", "9", 5e-324, 0.0009, 2.0, 2**64]),
)


@st.composite
def submit_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Bodies near the contract: each field valid, invalid or absent, sometimes an unknown one."""
    body: dict[str, Any] = {}
    body["type"] = draw(st.sampled_from(["t", "send_email", "a.b-c_d"]) | st.text(max_size=5))
    if draw(st.booleans()):
        body["payload"] = draw(
            st.dictionaries(st.text(max_size=8), json_values, max_size=4) | anything
        )
    if draw(st.booleans()):
        body["priority"] = draw(
            st.sampled_from(["high", "normal", "low"]) | st.integers(-2, 11) | anything
        )
    if draw(st.booleans()):
        body["max_retries"] = draw(st.integers(-2, 1002) | anything)
    if draw(st.booleans()):
        body["timeout_seconds"] = draw(st.floats(0, 700_000) | anything)
    schedule = draw(st.sampled_from(["none", "run_at", "delay", "both", "junk"]))
    if schedule in ("run_at", "both"):
        body["run_at"] = draw(instants).isoformat()
    if schedule in ("delay", "both"):
        body["delay_seconds"] = draw(st.floats(0, 400_000_000))
    if schedule == "junk":
        body[draw(st.sampled_from(["run_at", "delay_seconds"]))] = draw(anything)
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(max_size=6))] = draw(anything)
    return body


def _encode(body: Any, plain: bool) -> tuple[bytes, Any]:
    """The raw body and what it says (orjson writes inf as null: compare with what was sent).
    The standard encoder writes NaN/Infinity and keeps huge integers: hostile on purpose."""
    raw = json.dumps(body).encode() if plain else orjson.dumps(body)
    return raw, json.loads(raw)


def _check_round_trip(body: dict[str, Any], row: Any) -> None:
    assert orjson.loads(row.payload_json) == body.get("payload", {})
    assert row.job_type == body["type"]
    assert row.max_retries == body.get("max_retries")
    assert row.timeout_seconds == body.get("timeout_seconds")
    assert row.delay_seconds == body.get("delay_seconds")
    if body.get("run_at") is not None:  # null is the same as absent
        assert row.run_at == datetime.fromisoformat(body["run_at"])
    priority = body.get("priority", "normal")
    assert row.priority == {"high": 9, "normal": 5, "low": 1}.get(priority, priority)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(submit_bodies(), st.booleans())
def test_submit_raises_only_documented_errors_and_keeps_what_it_accepts(
    body: dict[str, Any], plain: bool
) -> None:
    try:
        raw, sent = _encode(body, plain)
    except (TypeError, ValueError, OverflowError):
        return  # not encodable by that encoder
    try:
        row = build_submit(raw, max_payload_bytes=LIMIT, idempotency_key=None)
    except DOCUMENTED:
        return
    _check_round_trip(sent, row)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_raise_only_documented_errors(raw: bytes) -> None:
    for build in (
        lambda: build_submit(raw, max_payload_bytes=LIMIT, idempotency_key=None),
        lambda: build_batch(raw, max_batch=3, max_payload_bytes=LIMIT, idempotency_key="k"),
    ):
        with contextlib.suppress(DOCUMENTED):
            build()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(submit_bodies(), min_size=0, max_size=5), st.booleans())
def test_batches_raise_only_documented_errors_and_keep_order(
    jobs: list[dict[str, Any]], plain: bool
) -> None:
    try:
        raw, sent = _encode({"jobs": jobs}, plain)
    except (TypeError, ValueError, OverflowError):
        return
    try:
        rows = build_batch(raw, max_batch=4, max_payload_bytes=LIMIT, idempotency_key=None)
    except DOCUMENTED:
        return
    assert len(rows) == len(jobs) <= 4
    for body, row in zip(sent["jobs"], rows, strict=True):
        _check_round_trip(body, row)


NUMBER = r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?"


@settings(max_examples=300, deadline=None)
@given(st.from_regex(NUMBER, fullmatch=True))
def test_a_number_is_kept_exactly_or_refused(literal: str) -> None:
    """Whatever number text a client sends comes back as that number (to a double's precision)
    or is refused: never 0.0 for a non-zero, never a float for an integer."""
    raw = b'{"type": "t", "payload": {"x": ' + literal.encode() + b"}}"
    try:
        row = build_submit(raw, max_payload_bytes=LIMIT, idempotency_key=None)
    except DOCUMENTED:
        return
    got = orjson.loads(row.payload_json)["x"]
    exact = Decimal(literal)
    if isinstance(got, int):
        assert Decimal(got) == exact
    else:
        assert got == float(exact) and (got != 0.0 or exact == 0)
        assert not ("." not in literal and "e" not in literal.lower()), "an integer became a float"


# Bytes that make up the suspect literals, and others, so matches are frequent.
_NUMBERISH = st.binary(max_size=120) | st.lists(
    st.sampled_from([b"0", b"1", b"9", b"e", b"E", b"-", b"+", b".", b" ", b'"', b"x", b"0" * 19]),
    max_size=60,
).map(b"".join)


@settings(max_examples=600, deadline=None)
@given(_NUMBERISH, st.integers(1, 64))
def test_the_fast_suspect_scan_agrees_with_the_rule(raw: bytes, window: int) -> None:
    """``body.suspect`` (translate + substring search, a window at a time) decides exactly what
    ``SUSPECT`` matches, whatever the window size: a body it missed would skip the exact number
    check."""
    import conveyor.api.body as body

    saved = body._WINDOW
    body._WINDOW = window
    try:
        assert body.suspect(raw) == bool(body.SUSPECT.search(raw))
    finally:
        body._WINDOW = saved
