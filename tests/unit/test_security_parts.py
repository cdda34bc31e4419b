"""Security, the parts without services: key format and hashing, scopes, the rate limiter and
the key cache on injected clocks, URL and key masking, and the deploy files generated from the
least-privilege tables."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from conveyor.api.keycache import KeyCache, parse_rate
from conveyor.api.ratelimit import FleetRateLimiter
from conveyor.broker.permissions import rabbitmqctl_commands
from conveyor.cli.support import database_error
from conveyor.core.apikeys import digest, effective, key_id_of, new_key, parse_scopes
from conveyor.core.secrets import mask, mask_url
from conveyor.store import ApiKeyRow
from conveyor.store.roles import DEFAULT_ROLES, roles_sql

ROOT = Path(__file__).resolve().parents[2]


def test_keys_are_random_and_only_their_id_is_public() -> None:
    key, key_id, key_hash = new_key()
    assert key_id_of(key) == key_id and key_hash == digest(key) and len(key_hash) == 32
    assert len({new_key()[0] for _ in range(100)}) == 100
    for bad in ("", key + "x", key[:-1], key.replace("cvk_", "cvx_"), " " + key):
        assert key_id_of(bad) is None


def test_scopes() -> None:
    assert parse_scopes("jobs:write, jobs:read") == ("jobs:read", "jobs:write")
    for bad in ("", "root", "jobs:read,root", "ADMIN"):
        with pytest.raises(ValueError):
            parse_scopes(bad)
    assert effective(["admin"]) == {"admin", "jobs:read", "jobs:write"}
    assert effective(["jobs:write"]) == {"jobs:read", "jobs:write"}


class _Bucket:
    """``store.keys.API_RATE_TAKE`` in memory (the real one: tests/e2e/test_security.py)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.rows: dict[str, tuple[float, float]] = {}
        self.clock = clock
        self.calls = 0

    async def take(self, who: str, rate: float, size: float, want: int) -> tuple[int, float]:
        self.calls += 1
        now = self.clock()
        tokens, at = self.rows.get(who, (size, now))
        tokens = min(size, tokens + (now - at) * rate)
        got = min(math.floor(tokens), want)
        self.rows[who] = (tokens - got, now)
        return got, tokens - got


async def test_rate_limiter_refills_and_says_how_long_to_wait() -> None:
    now = [0.0]
    bucket = _Bucket(lambda: now[0])
    limiter = FleetRateLimiter("2/s", bucket.take, clock=lambda: now[0])

    async def takes(lim: FleetRateLimiter, who: str, n: int) -> list[int | None]:
        return [await lim.take(who) for _ in range(n)]

    assert await takes(limiter, "a", 3) == [None, None, 1]
    assert await limiter.take("b") is None  # per key
    now[0] = 0.5
    assert await limiter.take("a") is None and await limiter.take("a") == 1
    slow = FleetRateLimiter("6/m", bucket.take, clock=lambda: now[0])
    assert (await takes(slow, "s", 7))[-1] == 10
    assert await FleetRateLimiter(None, bucket.take).take("a") is None


async def test_rate_limiter_is_fleet_wide_and_cheap() -> None:
    """Two processes share one bucket: a key gets its quota once, not once per process. A key
    within its quota costs a statement per chunk; one refused, a statement per window."""
    now = [0.0]
    bucket = _Bucket(lambda: now[0])
    a, b = (FleetRateLimiter("5/m", bucket.take, clock=lambda: now[0]) for _ in range(2))
    got = [await (a if i % 2 else b).take("k") for i in range(10)]
    assert got.count(None) == 5, got
    calls = bucket.calls
    assert [await a.take("k") for _ in range(100)].count(None) == 0
    assert bucket.calls == calls, "a refusal is trusted locally for a window"
    fast = FleetRateLimiter("400/s", bucket.take, clock=lambda: now[0])
    calls = bucket.calls
    assert [await fast.take("f") for _ in range(300)].count(None) == 300
    assert bucket.calls - calls == 3  # chunks of 100


def test_parse_rate() -> None:
    assert parse_rate("50/s") == (50.0, 50.0)
    for bad in ("50", "x/s", "0/s", "5/d"):
        with pytest.raises(ValueError):
            parse_rate(bad)


class _FakeApi:
    def __init__(self, row: ApiKeyRow | None) -> None:
        self.row, self.calls = row, 0
        self.store = self

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        yield None

    async def api_key_get(self, conn: Any, key_id: str) -> ApiKeyRow | None:
        self.calls += 1
        await asyncio.sleep(0.01)
        return self.row


async def test_key_cache_ttl_single_flight_and_revocation() -> None:
    key, key_id, key_hash = new_key()
    row = ApiKeyRow(key_id, "k", key_hash, ("jobs:read",), None, None)  # type: ignore[arg-type]
    api, now = _FakeApi(row), [0.0]
    cache = KeyCache(api, ttl=2, clock=lambda: now[0])
    got = await asyncio.gather(*[cache.verify(key) for _ in range(50)])
    assert all(g == row for g in got) and api.calls == 1  # one read for 50 concurrent requests
    assert await cache.verify(key[:-1] + ("A" if key[-1] != "A" else "B")) is None  # wrong secret
    api.row = ApiKeyRow(key_id, "k", key_hash, ("jobs:read",), None, 1)  # type: ignore[arg-type]
    now[0] = 1.9
    assert await cache.verify(key) == row  # still within the TTL
    now[0] = 2.1
    assert await cache.verify(key) is None and api.calls == 2  # revoked, seen after the TTL
    assert await cache.verify("not a key") is None and api.calls == 2  # no lookup at all


def test_masking() -> None:
    assert mask_url("postgresql://app:s3cret@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert mask_url("amqp://guest:guest@127.0.0.1:5672/") == "amqp://guest:***@127.0.0.1:5672/"
    assert mask_url("postgresql://postgres@127.0.0.1/x") == "postgresql://postgres@127.0.0.1/x"
    key = new_key()[0]
    text = mask(f"connect amqp://u:p%40ss@h/ failed; key {key}")
    assert "p%40ss" not in text and key.split("_", 2)[2] not in text and key[:16] in text


def test_a_url_urlsplit_refuses_is_masked_in_the_clis_database_error() -> None:
    """An unclosed IPv6 bracket makes urlsplit raise: the message about the database still
    comes out, with the password masked (not a ValueError in its place)."""
    bad = "postgresql://app:s3cret@[::1/x"
    assert mask_url(bad) == "postgresql://app:***@[::1/x"
    settings: Any = type("S", (), {"database_url": bad, "db_schema": "conveyor"})()
    error = database_error(ConnectionRefusedError("refused"), settings)
    assert error is not None and "s3cret" not in str(error) and "app:***@" in str(error)


def test_deploy_files_are_generated_from_the_tables() -> None:
    sql = (ROOT / "deploy/postgres-roles.sql").read_text()
    assert sql == roles_sql("conveyor"), (
        "regenerate: conveyor roles sql > deploy/postgres-roles.sql"
    )
    amqp = (ROOT / "deploy/rabbitmq-users.sh").read_text()
    assert amqp == rabbitmqctl_commands("jobs"), "regenerate: conveyor roles amqp > deploy/..."
    assert "TRUNCATE" not in sql and "CREATE ON" not in sql and "ALL PRIVILEGES" not in sql


def test_cli_stderr_masks_credentials() -> None:
    import io

    from conveyor.core.secrets import MaskedStream

    out = io.StringIO()
    MaskedStream(out).write(f"failed: postgresql://app:topsecret@db/x and {new_key()[0]}\n")
    assert "topsecret" not in out.getvalue() and "app:***@db" in out.getvalue()
    assert "cvk_" in out.getvalue() and out.getvalue().count("***") == 2


def test_schedule_horizon() -> None:
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from conveyor.core.errors import InvalidJob
    from conveyor.jobs.spec import check_horizon

    soon = SimpleNamespace(run_at=datetime.now(UTC) + timedelta(hours=1))
    later = SimpleNamespace(run_at=datetime.now(UTC) + timedelta(days=2))
    check_horizon([soon, SimpleNamespace(run_at=None)], 1)
    with pytest.raises(InvalidJob, match=r"jobs\[1\]"):
        check_horizon([soon, later], 1)
    far = SimpleNamespace(run_at=datetime(9998, 12, 31, tzinfo=UTC))
    check_horizon([far], 3_000_000)  # a horizon past year 9999 is no horizon (no overflow)


def test_broker_permissions_cover_dotted_types_and_the_high_band() -> None:
    """A job type with a dot (``email.send`` is valid) is covered: with ``[^.]+`` the publisher
    could not declare its queue under the generated permissions."""
    import re

    from conveyor.broker.permissions import permissions

    for queue in ("jobs.queue.email.send", "jobs.high.email.send", "jobs.queue.a"):
        for component in ("publisher", "sweeper", "worker"):
            conf = permissions("jobs", component)[0]
            assert re.match(conf, queue), (component, queue)
    read = permissions("jobs", "worker", ["email.send"])[2]
    assert re.match(read, "jobs.high.email.send") and not re.match(read, "jobs.queue.other")


def test_roles_sql_tells_to_turn_jit_off_for_each_login_role() -> None:
    # docs/scaling.md, "JIT off for Conveyor's roles": behind PgBouncer it must live on the roles;
    # roles created by hand from the generated file (deploy/postgres-roles.sql) need it too
    sql = roles_sql("conveyor")
    for role in DEFAULT_ROLES.values():
        assert f"ALTER ROLE {role} SET jit = off" in sql, role
