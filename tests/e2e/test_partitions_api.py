"""The partition keys of a type over HTTP (``api/partitions.py``): ``GET /types`` shows a type's
partition settings, ``GET /types/{type}/partitions`` lists its keys in keyset pages, ``PUT
/types/{type}/partitions/{key}`` keeps an override until removed and admission obeys it (one
``admit`` pass called here: no admitter runs, nothing is timed). Keys travel as path segments,
percent-encoded: ``/``, spaces and unicode round-trip. Hostile input answers 400/404/422 in the
error shape, never a 500."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from conveyor import JobRouter, enqueue
from conveyor.api.partitions import PartitionResource
from conveyor.core.config import Settings
from conveyor.core.errors import InvalidJob
from conveyor.jobs.types import register_router_types
from conveyor.store import for_schema

from ..stack import running_stack

store = for_schema()
router = JobRouter()


@router.job("pa_sync", partition_by="acct", partition_concurrency=1, partition_rate_limit="10/m")
async def sync(job: object) -> None:
    return None


@router.job("pa_ordered", partition_by=("org", "user"), ordered=True)
async def ordered(job: object) -> None:
    return None


@router.job("pa_plain")
async def plain(job: object) -> None:
    return None


SLASHED = "org/7 ü"  # a key with '/', a space and unicode: %2F, %20, %C3%BC


def _path(key: str, job_type: str = "pa_sync") -> str:
    return f"/types/{job_type}/partitions/{quote(key, safe='')}"


async def _walk(client: httpx.AsyncClient, job_type: str, limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        r = await client.get(f"/types/{job_type}/partitions", params=params)
        assert r.status_code == 200, r.text
        out += r.json()["partitions"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return out


async def _admitted(db: asyncpg.Connection) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT partition_key AS k, count(*) AS n FROM jobs "
        "WHERE job_type = 'pa_sync' AND status = 'PENDING' GROUP BY 1"
    )
    return {r["k"]: r["n"] for r in rows}


async def test_types_show_their_partition_settings(
    settings: Settings, db: asyncpg.Connection
) -> None:
    await register_router_types(db, router)
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        types = {t["name"]: t for t in (await stack.client.get("/types")).json()["types"]}
    fields = ("partition_by", "partition_concurrency", "partition_rate_limit", "ordered")
    assert [types["pa_sync"][f] for f in fields] == [["acct"], 1, "10/m", None]
    assert [types["pa_ordered"][f] for f in fields] == [["org", "user"], None, None, "hold"]
    assert [types["pa_plain"][f] for f in fields] == [None, None, None, None]


async def test_keys_are_listed_changed_and_obeyed(
    settings: Settings, db: asyncpg.Connection
) -> None:
    await register_router_types(db, router)
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        c = stack.client
        for i in range(3):
            for acct in ("a", SLASHED, "z"):
                await stack.submit("pa_sync", {"acct": acct, "i": i})
        await stack.submit("pa_sync", {"i": 9}, partition_key="given")  # the submit's key wins
        listed = await _walk(c, "pa_sync", 100)
        assert {k["key"]: k["waiting"] for k in listed} == {"a": 3, SLASHED: 3, "z": 3, "given": 1}
        assert all(set(k) == set(PartitionResource.model_fields) for k in listed)
        assert {(k["limit"], k["concurrency"], k["paused"]) for k in listed} == {(1, None, False)}
        assert listed[-1]["key"] == "given"  # the newest wait last
        assert all(isinstance(k["oldest_wait_seconds"], float) for k in listed)

        # pause the slashed key: encoded, it round-trips
        r = await c.put(_path(SLASHED), json={"paused": True})
        assert r.status_code == 200, r.text
        view = r.json()
        assert (view["key"], view["paused"], view["waiting"], view["limit"]) == (
            SLASHED, True, 3, 1)  # fmt: skip
        # one admission pass (the admitter's): every key but the paused one
        assert await store.admit(db, "pa_sync", 100) == 3
        assert await _admitted(db) == {"a": 1, "z": 1, "given": 1}
        job = await db.fetchval("SELECT id FROM jobs WHERE partition_key = $1 LIMIT 1", SLASHED)
        assert (await c.get(f"/jobs/{job}")).json()["waiting_for"] == "paused"

        # an unencoded '/' reaches the same key (the route takes the rest of the path)
        r = await c.put(f"/types/pa_sync/partitions/{SLASHED}", json={"concurrency": 2})
        assert r.status_code == 200, r.text
        assert (r.json()["key"], r.json()["concurrency"], r.json()["limit"]) == (SLASHED, 2, 2)
        assert r.json()["paused"] is True  # left out: kept
        r = await c.put(_path(SLASHED), json={"paused": False})  # resumed, 2 at once
        assert await store.admit(db, "pa_sync", 100) == 2
        assert await _admitted(db) == {"a": 1, "z": 1, "given": 1, SLASHED: 2}
        key = {k["key"]: k for k in await _walk(c, "pa_sync", 100)}[SLASHED]
        assert (key["waiting"], key["admitted"], key["running"]) == (1, 2, 0)

        # removing the override: the type's limit again, and the key shows no override
        r = await c.put(_path(SLASHED), json={"concurrency": None, "paused": False})
        assert (r.json()["concurrency"], r.json()["limit"], r.json()["paused"]) == (None, 1, False)
        assert await db.fetchval("SELECT count(*) FROM partitions") == 0

        # an override of a key with no job is listed until removed
        r = await c.put(_path("idle"), json={"paused": True, "concurrency": 4})
        assert r.json() == {"key": "idle", "waiting": 0, "admitted": 0, "running": 0,
                            "oldest_wait_seconds": None, "limit": 4, "concurrency": 4,
                            "paused": True}  # fmt: skip
        assert "idle" in {k["key"] for k in await _walk(c, "pa_sync", 100)}
        await c.put(_path("idle"), json={"paused": False, "concurrency": None})
        assert "idle" not in {k["key"] for k in await _walk(c, "pa_sync", 100)}
        r = await c.put(_path("a"), json={})  # nothing to change: the key's view, as it is
        assert (r.status_code, r.json()["waiting"], r.json()["admitted"]) == (200, 2, 1)
        assert await db.fetchval("SELECT count(*) FROM partitions") == 0

        # pages of one: every key once, as the full page orders them
        whole = [k["key"] for k in await _walk(c, "pa_sync", 1000)]
        assert [k["key"] for k in await _walk(c, "pa_sync", 1)] == whole
        assert len(whole) == 4


async def test_hostile_input_is_refused_in_the_error_shape(
    settings: Settings, db: asyncpg.Connection
) -> None:
    await register_router_types(db, router)
    long_key = "ü" * 200  # 200 characters (400 bytes): the longest key
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        c = stack.client
        put = c.put
        cases: list[tuple[str, Any, int, str]] = [
            (_path("a"), {"content": b"{"}, 400, "malformed_json"),
            (_path("a"), {"content": b"\xff\xfe"}, 400, "malformed_json"),
            (_path("a"), {"json": [1]}, 422, "invalid_request"),
            (_path("a"), {"json": {"concurrency": -1}}, 422, "invalid_request"),
            (_path("a"), {"json": {"concurrency": 0}}, 422, "invalid_request"),
            (_path("a"), {"json": {"concurrency": 10_001}}, 422, "invalid_request"),
            (_path("a"), {"json": {"concurrency": 1.5}}, 422, "invalid_request"),
            (_path("a"), {"json": {"concurrency": True}}, 422, "invalid_request"),
            (_path("a"), {"json": {"concurrency": "3"}}, 422, "invalid_request"),
            (_path("a"), {"json": {"concurrency": 2**70}}, 422, "invalid_request"),
            (_path("a"), {"json": {"paused": None}}, 422, "invalid_request"),
            (_path("a"), {"json": {"paused": "yes"}}, 422, "invalid_request"),
            (_path("a"), {"json": {"other": 1}}, 422, "invalid_request"),
            (_path("x" * 201), {"json": {"paused": True}}, 422, "invalid_request"),
            (_path("ü" * 201), {"json": {"paused": True}}, 422, "invalid_request"),
            (_path("a\x00b"), {"json": {"paused": True}}, 422, "invalid_request"),
            ("/types/pa_sync/partitions/%2E", {"json": {"paused": True}}, 422, "invalid_request"),
            ("/types/pa_sync/partitions/%2E%2E", {"json": {}}, 422, "invalid_request"),
            ("/types/pa_sync/partitions/", {"json": {"paused": True}}, 422, "invalid_request"),
            (_path("a", "pa_nope"), {"json": {"paused": True}}, 404, "not_found"),
            (_path("a", "bad type!"), {"json": {"paused": True}}, 422, "invalid_request"),
        ]
        for path, kw, status, error in cases:
            r = await put(path, **kw)
            assert (r.status_code, r.json()["error"]) == (status, error), (path, kw, r.text)
            assert set(r.json()) == {"error", "detail"}
        detail = (await put(_path("a"), json={"concurrency": -1})).json()["detail"]
        assert detail[0]["loc"] == ["body", "concurrency"], detail
        assert "from 1 to 10000" in detail[0]["msg"], detail
        assert await db.fetchval("SELECT count(*) FROM partitions") == 0  # nothing written

        ok = [
            (_path("a"), {"json": {"concurrency": 2.0}}, 2),  # JSON Schema's integer
            (_path(long_key), {"json": {"concurrency": 10_000}}, 10_000),
            (_path(".a"), {"json": {"concurrency": 1}}, 1),
            (_path("..."), {"json": {"concurrency": 3}}, 3),
            (_path("50%"), {"json": {"concurrency": 5}}, 5),  # %25
            (_path("?#&="), {"json": {"concurrency": 6}}, 6),
        ]
        for path, kw, concurrency in ok:
            r = await put(path, **kw)
            assert r.status_code == 200 and r.json()["concurrency"] == concurrency, (path, r.text)
        keys = {k["key"] for k in await _walk(c, "pa_sync", 2)}
        assert keys == {"a", long_key, ".a", "...", "50%", "?#&="}

        gets: list[tuple[str, dict[str, Any], int, str]] = [
            ("/types/pa_nope/partitions", {}, 404, "not_found"),
            ("/types/bad%20type/partitions", {}, 422, "invalid_request"),
            ("/types/pa_sync/partitions", {"limit": 0}, 422, "invalid_request"),
            ("/types/pa_sync/partitions", {"limit": 1001}, 422, "invalid_request"),
            ("/types/pa_sync/partitions", {"limit": "x"}, 422, "invalid_request"),
            ("/types/pa_sync/partitions", {"cursor": "not a cursor"}, 422, "invalid_request"),
            ("/types/pa_sync/partitions", {"cursor": "n." + "A" * 1072}, 422, "invalid_request"),
            ("/types/pa_sync/partitions", {"cursor": "bm9wZQ"}, 422, "invalid_request"),
            ("/types/pa_sync/partitions", {"cursor": "n.A"}, 422, "invalid_request"),  # base64?
            ("/types/pa_sync/partitions", {"cursor": "-99999999999999999.YQ"}, 422,
             "invalid_request"),  # before the year 1
            ("/types/pa_sync/partitions", {"cursor": "999999999999999999.YQ"}, 422,
             "invalid_request"),  # past the year 9999
        ]  # fmt: skip
        for path, params, status, error in gets:
            r = await c.get(path, params=params)
            assert (r.status_code, r.json()["error"]) == (status, error), (path, params, r.text)
        # any cursor of the right shape is a position to start after, whatever it holds: a key
        # that is no UTF-8 or holds a NUL (no page gives such a cursor) is read as replaced
        for forged in ("n.AA", "n.__8", "0.YQBi", "-9999999999999999.AAAA", "99999999999999999."):
            r = await c.get("/types/pa_sync/partitions", params={"cursor": forged})
            assert r.status_code == 200, (forged, r.text)
        r = await c.get("/types/pa_sync/partitions", params={"cursor": "n.YQ"})  # after "a"
        whole = [k["key"] for k in await _walk(c, "pa_sync", 1000)]  # none waits: by key
        assert whole.index("a") < len(whole) - 1  # "ü" * 200 sorts after it in any collation
        assert [k["key"] for k in r.json()["partitions"]] == whole[whole.index("a") + 1 :]
        # a type that does not exist: 404 whatever the cursor
        r = await c.get("/types/pa_nope/partitions", params={"cursor": "n.YQ"})
        assert r.status_code == 404
        # the method not there: 405 with the true Allow header
        r = await c.get(_path("a"))
        assert r.status_code == 405 and "PUT" in r.headers["allow"], r.headers
        assert "GET" not in r.headers["allow"]


async def test_openapi_declares_the_routes(settings: Settings) -> None:
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        spec = (await stack.client.get("/openapi.json")).json()
    paths = spec["paths"]
    assert set(paths["/types/{name}/partitions"]) == {"get"}
    put = paths["/types/{name}/partitions/{key}"]["put"]
    key = next(p for p in put["parameters"] if p["name"] == "key")
    assert key["schema"]["maxLength"] == 200 and key["in"] == "path"
    assert {"200", "400", "404", "422"} <= set(put["responses"])


async def test_a_submits_partition_key_with_a_nul_is_refused(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """PostgreSQL's text holds no NUL: such a key is the submitter's error (422 through the API,
    ``InvalidJob`` from ``enqueue()``), not the server's (it was a 500)."""
    await register_router_types(db, router)
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        for body in (
            {"type": "pa_sync", "payload": {"acct": "a"}, "partition_key": "a\x00b"},
            {"type": "pa_plain", "partition_key": "\x00"},
        ):
            r = await stack.client.post("/jobs", json=body)
            assert r.status_code == 422, r.text
            r = await stack.client.post("/jobs/batch", json={"jobs": [body]})
            assert r.status_code == 422, r.text
    with pytest.raises(InvalidJob, match="NUL"):
        await enqueue(db, "pa_sync", {"acct": "a"}, partition_key="a\x00b")
    assert await db.fetchval("SELECT count(*) FROM jobs") == 0
