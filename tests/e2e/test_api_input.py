"""Hostile input over real HTTP: no 500s, no silent changes, limits that measure bytes,
the NUL check that tells a NUL from the text ``\\u0000``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import orjson
import pytest

from conveyor.core.config import Settings

from ..stack import Stack, running_stack


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    # the round trip of extreme dates (year 9998) is tested here: no schedule horizon (the
    # horizon's own test is test_quotas.py)
    far = settings.model_copy(update={"max_schedule_days": 3_000_000})
    async with running_stack(far, None, maintenance=False, relays=0) as s:
        yield s


async def _jobs(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM jobs"))


def _post(stack: Stack, path: str, raw: bytes, **headers: str):  # type: ignore[no-untyped-def]
    return stack.client.post(
        path, content=raw, headers={"content-type": "application/json", **headers}
    )


OUT_OF_RANGE = ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+01:00"]
# asyncpg's ±infinity instants, and any year 0001 or 9999 as written (the documented range)
SENTINELS = ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "0001-06-01T00:00:00Z"]


@pytest.mark.parametrize(
    "raw",
    [
        # 9.2: run_at whose UTC time leaves years 1-9999 (was a 500), alone and in a batch
        *(orjson.dumps({"type": "t", "run_at": v}) for v in OUT_OF_RANGE),
        # 9.3: asyncpg's ±infinity sentinels (were stored as -infinity / infinity)
        *(orjson.dumps({"type": "t", "run_at": v}) for v in SENTINELS),
        # 9.3: non-finite and out-of-range numbers anywhere (were stored as null / 0.0)
        b'{"type": "t", "payload": {"x": NaN}}',
        b'{"type": "t", "payload": {"x": [Infinity]}}',
        b'{"type": "t", "payload": {"x": -Infinity}}',
        b'{"type": "t", "payload": {"x": 1e400}}',
        b'{"type": "t", "payload": {"x": 1e-400}}',
        b'{"type": "t", "payload": {"x": 0.' + b"0" * 400 + b"1}}",
        b'{"type": "t", "payload": {"x": 18446744073709551616}}',
        b'{"type": "t", "payload": {"x": -9223372036854775809}}',
        b'{"type": "t", "timeout_seconds": 1e400}',
        # 9.3: strict types (were coerced)
        b'{"type": "t", "max_retries": true}',
        b'{"type": "t", "max_retries": 2.5}',
        b'{"type": "t", "timeout_seconds": "30"}',
        b'{"type": "t", "timeout_seconds": true}',
        b'{"type": "t", "timeout_seconds": 5e-324}',
        b'{"type": "t", "timeout_seconds": 0.0009}',
        b'{"type": "t", "delay_seconds": "5"}',
        b'{"type": "t", "run_at": 0}',
        b'{"type": "t", "run_at": "0"}',
        b'{"type": "t", "run_at": "1700000000"}',
        b'{"type": "t", "priority": "9"}',
        b'{"type": 5}',
        # 9.5: a real NUL in a key or a value
        b'{"type": "t", "payload": {"\\u0000": 1}}',
        b'{"type": "t", "payload": {"a": ["x\\u0000y"]}}',
    ],
)
async def test_hostile_submits_are_422_and_write_nothing(
    stack: Stack, db: asyncpg.Connection, raw: bytes
) -> None:
    r = await _post(stack, "/jobs", raw)
    assert r.status_code == 422, (raw[:80], r.status_code, r.text[:300])
    assert set(r.json()) == {"error", "detail"}
    batch = b'{"jobs": [{"type": "ok"}, ' + raw + b"]}"
    r = await _post(stack, "/jobs/batch", batch)
    assert r.status_code == 422, (raw[:80], r.status_code, r.text[:300])
    assert await _jobs(db) == 0


async def test_list_with_a_nul_type_is_422_not_500(stack: Stack) -> None:
    r = await stack.client.get("/jobs?type=%00")
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request"


async def test_accepted_values_come_back_unchanged(stack: Stack) -> None:
    payload = {
        "tiny": 5e-324,
        "big": 1.7976931348623157e308,
        "u64": 18446744073709551615,
        "i64": -9223372036854775808,
        "text": "\\u0000 is six characters here",
        "\\u0000": "so is this key",
        "emoji": "\U0001f600",
    }
    body = {"type": "t", "payload": payload, "timeout_seconds": 0.001, "max_retries": 0,
            "run_at": "0002-01-01T00:00:00.000001Z"}  # fmt: skip
    r = await stack.client.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    got = (await stack.client.get(f"/jobs/{r.json()['id']}")).json()
    assert got["payload"] == payload
    assert got["timeout_seconds"] == 0.001 and got["max_retries"] == 0
    assert got["run_at"].startswith("0002-01-01T00:00:00.000001")
    far = await stack.client.post(
        "/jobs", json={"type": "t", "run_at": "9998-12-31T23:59:59-14:00"}
    )
    assert far.status_code == 201 and far.json()["run_at"].startswith("9999-01-01T13:59:59")
    assert far.json()["status"] == "SCHEDULED"


async def test_payload_limit_counts_utf8_bytes(stack: Stack, db: asyncpg.Connection) -> None:
    emoji = {"type": "t", "payload": {"e": "\U0001f600" * 200_000}}  # 800 KB, 200k characters
    r = await stack.client.post("/jobs/batch", json={"jobs": [emoji]})
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "payload_too_large"
    assert "jobs[0]" in r.json()["detail"]
    assert await _jobs(db) == 0


async def test_nan_and_null_bodies_are_not_the_same_request(stack: Stack) -> None:
    h = {"Idempotency-Key": "nan-vs-null"}
    first = await _post(stack, "/jobs", b'{"type": "t", "payload": {"x": null}}', **h)
    assert first.status_code == 201
    nan = await _post(stack, "/jobs", b'{"type": "t", "payload": {"x": NaN}}', **h)
    assert nan.status_code == 422, nan.text
