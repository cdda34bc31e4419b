"""Properties of the wire format: whatever the bytes, ``decode`` raises nothing but the documented
``MalformedMessage``; every message ``encode`` makes decodes to itself."""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.broker import wire
from conveyor.broker.wire import JobMessage, MalformedMessage, decode, encode

# text PostgreSQL can hold and JSON can carry (no lone surrogates; NUL and controls included)
text = st.text(st.characters(blacklist_categories=("Cs",)))
attempts = st.none() | st.integers(min_value=1, max_value=wire.MAX_ATTEMPT)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


def _decode_or_malformed(body: bytes) -> JobMessage | None:
    try:
        return decode(body)
    except MalformedMessage:
        return None


@given(st.binary(max_size=2048))
def test_arbitrary_bytes_decode_or_raise_malformed(body: bytes) -> None:
    _decode_or_malformed(body)  # any other exception fails the test


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["id", "type", "attempt", "error", "x"]) | text,
        json_values | st.uuids().map(str),
        max_size=6,
    )
)
def test_arbitrary_json_objects_decode_or_raise_malformed(data: dict[str, Any]) -> None:
    got = _decode_or_malformed(json.dumps(data).encode())  # big ints too (orjson cannot)
    if got is not None:
        assert str(got.job_id) == str(data["id"]).lower() and got.job_type == data["type"]


@given(st.uuids(), text, attempts, st.none() | text)
def test_encode_then_decode_round_trips(
    job_id: uuid.UUID, job_type: str, attempt: int | None, error: str | None
) -> None:
    message = JobMessage(job_id, job_type, attempt, error)
    got = decode(message.encode())
    expected_error = None if error is None else error[: wire.MAX_ERROR_CHARS]
    assert got == JobMessage(job_id, job_type, attempt, expected_error)


@given(st.uuids(), st.text(st.sampled_from('\x00\x1f"\\\u2028'), min_size=2000, max_size=2000))
def test_the_largest_dead_letter_fits(job_id: uuid.UUID, error: str) -> None:
    """2000 characters of six-byte escapes still decode (the size limit is not a trap)."""
    body = encode(job_id, "t", attempt=1, error=error)
    assert decode(body).error == error


def test_work_message_is_the_small_json_object() -> None:
    job_id = uuid.uuid4()
    assert orjson.loads(encode(job_id, "send_email")) == {"id": str(job_id), "type": "send_email"}


def test_lone_surrogates_are_replaced_not_raised() -> None:
    got = decode(encode(uuid.uuid4(), "t", attempt=2, error="bad \ud800 text"))
    assert got.attempt == 2 and got.error == "bad ? text"


def test_non_canonical_ids_and_bad_attempts_are_malformed() -> None:
    u = uuid.uuid4()
    for data in (
        {"id": "{" + str(u) + "}", "type": "t"},
        {"id": "urn:uuid:" + str(u), "type": "t"},
        {"id": str(u).replace("-", ""), "type": "t"},
        {"id": str(u), "type": "t", "attempt": True},
        {"id": str(u), "type": "t", "attempt": 0},
        {"id": str(u), "type": "t", "attempt": 1.0},
        {"id": str(u), "type": "t", "error": 5},
    ):
        assert _decode_or_malformed(orjson.dumps(data)) is None, data


def test_escaped_surrogates_huge_numbers_and_deep_nesting_are_malformed() -> None:
    u = uuid.uuid4()
    for body in (
        b'{"id": "%s", "type": "\\ud800"}' % str(u).encode(),
        b'{"id": "%s", "type": "t", "attempt": 99999999999999999999999}' % str(u).encode(),
        b"[" * 5000 + b"]" * 5000,
        b"[" * (wire.MAX_MESSAGE_BYTES + 1),
    ):
        assert _decode_or_malformed(body) is None


def test_the_traceparent_header_is_set_only_when_traced() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert wire.properties("x", 5).headers is None
    assert wire.properties("x", 5, tp).headers == {"traceparent": tp}
    assert wire.traceparent_of({"traceparent": tp}) == tp
    assert wire.traceparent_of({"traceparent": tp.encode()}) == tp
    assert wire.traceparent_of({"traceparent": 7}) is None
    assert wire.traceparent_of(None) is None and wire.traceparent_of({}) is None
