"""``/workflows`` over real HTTP: submit (with its Idempotency-Key replay and conflict), read,
list in keyset pages, cancel; every invalid workflow a 422 that writes nothing; the job resource
naming its workflow and dependencies. The scopes are test_security.py's route matrix."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from conveyor.core.config import Settings

from ..stack import Stack, running_stack

FAN = {
    "name": "nightly",
    "jobs": [
        {"key": "fetch", "type": "a", "payload": {"day": "2026-11-25"}},
        {"key": "a", "type": "b", "payload": {"i": 1}, "after": ["fetch"]},
        {"key": "b", "type": "b", "payload": {"i": 2}, "after": ["fetch"],
         "priority": "high", "max_retries": 2},
        {"key": "report", "type": "c", "after": ["a", "b"]},
    ],
}  # fmt: skip


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    # no relay, no sweeper: the tests count what each request wrote
    async with running_stack(settings, None, maintenance=False, relays=0) as s:
        yield s


async def _rows(db: asyncpg.Connection) -> tuple[int, int, int, int]:
    return (
        await db.fetchval("SELECT count(*) FROM workflows"),
        await db.fetchval("SELECT count(*) FROM jobs"),
        await db.fetchval("SELECT count(*) FROM job_dependencies"),
        await db.fetchval("SELECT count(*) FROM job_outbox"),
    )


def _by_key(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {j["key"]: j for j in wf["jobs"]}


async def test_submit_read_and_the_job_resource(stack: Stack, db: asyncpg.Connection) -> None:
    r = await stack.client.post("/workflows", json=FAN)
    assert r.status_code == 201, r.text
    wf = r.json()
    assert (wf["name"], wf["status"], wf["on_failure"]) == ("nightly", "RUNNING", "cancel")
    jobs = _by_key(wf)
    assert {k: j["status"] for k, j in jobs.items()} == {
        "fetch": "PENDING", "a": "WAITING", "b": "WAITING", "report": "WAITING"
    }  # fmt: skip
    # each once, after what it waits for (a fan-in once, not once per dependency)
    assert [j["key"] for j in wf["jobs"]] == ["fetch", "a", "b", "report"]
    assert jobs["report"]["after"] == ["a", "b"]
    assert set(jobs["report"]["depends_on"]) == {jobs["a"]["id"], jobs["b"]["id"]}
    assert wf["counts"] == {"jobs": 4, "waiting": 3, "queued": 1, "running": 0,
                            "completed": 0, "failed": 0, "cancelled": 0}  # fmt: skip
    assert await _rows(db) == (1, 4, 4, 1)  # only the source has a message

    got = await stack.client.get(f"/workflows/{wf['id']}")
    assert got.status_code == 200 and got.json() == wf
    job = (await stack.client.get(f"/jobs/{jobs['b']['id']}")).json()
    assert job["workflow_id"] == wf["id"] and job["depends_on"] == [jobs["fetch"]["id"]]
    assert (job["priority"], job["max_retries"], job["payload"]) == (9, 2, {"i": 2})
    plain = (await stack.client.post("/jobs", json={"type": "t"})).json()
    assert (plain["workflow_id"], plain["depends_on"]) == (None, [])
    listed = (await stack.client.get("/jobs", params={"status": "WAITING"})).json()["jobs"]
    assert {j["id"]: j["workflow_id"] for j in listed} == {
        jobs[k]["id"]: wf["id"] for k in ("a", "b", "report")
    }
    assert (await stack.client.get(f"/workflows/{uuid.uuid4()}")).status_code == 404
    assert (await stack.client.get("/workflows/not-a-uuid")).status_code == 404


async def test_idempotency_replay_and_conflict(stack: Stack, db: asyncpg.Connection) -> None:
    h = {"Idempotency-Key": "nightly-2026-11-25"}
    first = await stack.client.post("/workflows", json=FAN, headers=h)
    again = await stack.client.post("/workflows", json=FAN, headers=h)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other = await stack.client.post("/workflows", json={**FAN, "name": "other"}, headers=h)
    assert other.status_code == 409 and other.json()["error"] == "idempotency_conflict"
    assert await _rows(db) == (1, 4, 4, 1)
    # the key is the workflow's own: a job may use the same one
    assert (await stack.client.post("/jobs", json={"type": "t"}, headers=h)).status_code == 201
    bad = await stack.client.post("/workflows", json=FAN, headers={"Idempotency-Key": ""})
    assert bad.status_code == 422


def _job(key: str, *after: str, **kw: Any) -> dict[str, Any]:
    return {"key": key, "type": "t", "after": list(after), **kw}


INVALID = [
    ({"name": "c", "jobs": [_job("a", "b"), _job("b", "a")]}, "invalid_workflow", "cycle"),
    ({"name": "s", "jobs": [_job("a", "a")]}, "invalid_workflow", "cycle"),
    ({"name": "u", "jobs": [_job("a", "nope")]}, "invalid_workflow", "'nope'"),
    ({"name": "d", "jobs": [_job("a"), _job("a")]}, "invalid_workflow", "already has"),
    ({"name": "t", "jobs": [_job(f"j{i}") for i in range(6)]}, "invalid_workflow", "limit is 5"),
    ({"name": "j", "jobs": [_job("a"), _job("b", "a", max_retries=-1)]}, "invalid_request", ""),
    ({"name": "j", "jobs": [_job("a", payload={"s": "\x00"})]}, "invalid_job", "'a'"),
    ({"name": "j", "jobs": [_job("a", run_at="2030-01-01T00:00Z", delay_seconds=1)]},
     "invalid_request", ""),
    ({"name": "j", "jobs": [_job("a", unique_key="k")]}, "invalid_job", "unique_for"),
    ({"name": "", "jobs": [_job("a")]}, "invalid_request", ""),
    ({"name": "n", "jobs": []}, "invalid_request", ""),
    ({"name": "n", "jobs": [_job("a")], "on_failure": "ignore"}, "invalid_request", ""),
    ({"name": "n", "jobs": [{"type": "t"}]}, "invalid_request", ""),
    ({"name": "n", "jobs": [_job("a", "b", "b"), _job("b")]}, "invalid_workflow", "twice"),
    ({"name": "n", "jobs": [_job("a"), _job("b", "a"), _job("c", "a", "b")]}, "invalid_workflow",
     "3 dependencies; the limit is 2 (CONVEYOR_MAX_WORKFLOW_EDGES)"),
    ({"name": "n", "jobs": [_job("a"), _job("b", "a", type="nobody_registered_this")]},
     "unknown_job_type", "nobody_registered_this"),
]  # fmt: skip


async def test_invalid_workflows_are_422_and_write_nothing(
    stack: Stack, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_MAX_WORKFLOW_JOBS", "5")
    monkeypatch.setenv("CONVEYOR_MAX_WORKFLOW_EDGES", "2")
    for body, error, words in INVALID:
        r = await stack.client.post("/workflows", json=body)
        assert r.status_code == 422 and r.json()["error"] == error, (body, r.text)
        assert words in str(r.json()["detail"]), (body, r.text)
    # a unique job already holding its key: refused after the insert, rolled back whole
    held = {"type": "t", "unique_for": 60, "unique_key": "k1"}
    assert (await stack.client.post("/jobs", json=held)).status_code == 201
    r = await stack.client.post(
        "/workflows", json={"name": "u", "jobs": [_job("a"), _job("b", "a", unique_for=60,
                                                                   unique_key="k1")]}
    )  # fmt: skip
    assert r.status_code == 422 and "'b'" in r.json()["detail"], r.text
    assert await _rows(db) == (0, 1, 0, 1)


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b'{"name": "x", "jobs": [', 400, "malformed_json"),
        (b'{"name": "x", "jobs": [{"key": "a", "type": "a", "payload": {"v": NaN}}]}', 422,
         "invalid_number"),
        (b'{"name": "x", "jobs": [{"key": "a", "type": "a", "payload": {"v": 1e400}}]}', 422,
         "invalid_number"),
        (b'{"name": "x", "jobs": [{"key": "a", "type": "a", "payload": '
         + b'{"v": ' * 1100 + b"1" + b"}" * 1100 + b"}]}", 422, "nesting_too_deep"),
    ],
)  # fmt: skip
async def test_a_workflow_body_is_read_as_a_batch_body_is(
    stack: Stack, db: asyncpg.Connection, body: bytes, status: int, error: str
) -> None:
    """The same strict JSON as POST /jobs/batch (no NaN, no overflowing number, bounded
    nesting; malformed JSON a 400), and the same answer, for the same body in a batch."""
    headers = {"content-type": "application/json"}
    r = await stack.client.post("/workflows", content=body, headers=headers)
    assert (r.status_code, r.json()["error"]) == (status, error), r.text
    as_batch = body.replace(b'"name": "x", ', b"").replace(b'"key": "a", ', b"")
    b = await stack.client.post("/jobs/batch", content=as_batch, headers=headers)
    assert (b.status_code, b.json()["error"]) == (status, error), b.text
    assert await _rows(db) == (0, 0, 0, 0)


@pytest.mark.parametrize("limit", [1000, 300 * 1024])  # below and above the default 256 KiB
async def test_workflow_jobs_have_the_plain_jobs_payload_limit(
    settings: Settings, db: asyncpg.Connection, limit: int
) -> None:
    configured = settings.model_copy(update={"max_payload_bytes": limit})
    async with running_stack(configured, None, maintenance=False, relays=0) as s:
        for size in (limit, limit + 1):  # '{"s":""}' is 8 bytes
            payload = {"s": "x" * (size - 8)}
            before = await _rows(db)
            wf = await s.client.post("/workflows", json={"name": "p", "jobs": [
                _job("a"), _job("b", "a", payload=payload)]})  # fmt: skip
            plain = await s.client.post("/jobs", json={"type": "t", "payload": payload})
            assert wf.status_code == (201 if size == limit else 413), wf.text
            assert plain.status_code == wf.status_code, plain.text
            if size > limit:
                assert wf.json()["error"] == plain.json()["error"] == "payload_too_large"
                assert "'b'" in wf.json()["detail"]
                assert await _rows(db) == before


async def test_list_filters_and_keyset_pages(stack: Stack) -> None:
    ids = []
    for i in range(7):
        body = {"name": "even" if i % 2 == 0 else "odd", "jobs": [_job("only")]}
        ids.append((await stack.client.post("/workflows", json=body)).json()["id"])
    cancelled = ids[0]
    assert (await stack.client.post(f"/workflows/{cancelled}/cancel")).status_code == 200
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await stack.client.get("/workflows", params=params)).json()
        assert len(page["workflows"]) <= 3
        seen += [w["id"] for w in page["workflows"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]  # newest first, each once
    evens = (await stack.client.get("/workflows", params={"name": "even"})).json()["workflows"]
    assert [w["id"] for w in evens] == [ids[6], ids[4], ids[2], ids[0]]
    assert evens[0]["counts"]["queued"] == 1 and "jobs" not in evens[0]
    done = (await stack.client.get("/workflows", params={"status": "CANCELLED"})).json()
    assert [w["id"] for w in done["workflows"]] == [cancelled]
    # each filter is a statement of its own (workflow_pages.page_statement): status, name,
    # both, and a filter's keyset pages
    both = {"name": "even", "status": "RUNNING"}
    running_evens = (await stack.client.get("/workflows", params=both)).json()["workflows"]
    assert [w["id"] for w in running_evens] == [ids[6], ids[4], ids[2]]
    for params in ({"name": "even"}, {"status": "RUNNING"}):
        seen, cursor = [], None
        while True:
            query = {**params, "limit": 2, **({"cursor": cursor} if cursor else {})}
            page = (await stack.client.get("/workflows", params=query)).json()
            seen += [w["id"] for w in page["workflows"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        expected = [ids[6], ids[4], ids[2], ids[0]] if "name" in params else ids[:0:-1]
        assert seen == expected, params
    for bad in ({"status": "NOPE"}, {"cursor": "%%%"}, {"limit": 0}, {"limit": 501}):
        assert (await stack.client.get("/workflows", params=bad)).status_code == 422, bad


async def test_cancel_is_idempotent(stack: Stack, db: asyncpg.Connection) -> None:
    wf = (await stack.client.post("/workflows", json=FAN)).json()
    first = await stack.client.post(f"/workflows/{wf['id']}/cancel")
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "CANCELLED"
    assert {j["status"] for j in body["jobs"]} == {"CANCELLED"}
    assert body["counts"]["cancelled"] == 4
    again = await stack.client.post(f"/workflows/{wf['id']}/cancel")
    assert again.status_code == 200 and again.json() == body
    # nothing released: the only message is the source's, sent before (its worker drops it)
    assert await db.fetchval("SELECT count(*) FROM job_outbox") == 1
    missing = await stack.client.post(f"/workflows/{uuid.uuid4()}/cancel")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


async def test_openapi_documents_the_workflow_operations(stack: Stack) -> None:
    spec = (await stack.client.get("/openapi.json")).json()
    paths = spec["paths"]
    assert {"/workflows", "/workflows/{workflow_id}", "/workflows/{workflow_id}/cancel"} <= set(
        paths
    )
    submit = paths["/workflows"]["post"]
    assert {"200", "201", "409", "422"} <= set(submit["responses"])
    assert any(p["name"] == "Idempotency-Key" for p in submit["parameters"])
    schemas = spec["components"]["schemas"]
    assert schemas["SubmitWorkflow"]["examples"]
    assert {"workflow_id", "depends_on"} <= set(schemas["JobResource"]["properties"])

    # one keyset page definition: the same limit and cursor parameters as GET /jobs
    def page(path: str) -> list[Any]:
        return [p for p in paths[path]["get"]["parameters"] if p["name"] in ("limit", "cursor")]

    assert page("/workflows") == page("/jobs") and len(page("/jobs")) == 2


async def test_the_same_key_at_once_makes_one_workflow(
    stack: Stack, db: asyncpg.Connection
) -> None:
    h = {"Idempotency-Key": "raced"}
    for _ in range(3):
        answers = await asyncio.gather(
            *(stack.client.post("/workflows", json=FAN, headers=h) for _ in range(4))
        )
        codes = sorted(a.status_code for a in answers)
        assert codes in ([200, 200, 200, 200], [200, 200, 200, 201]), [a.text for a in answers]
        assert len({a.json()["id"] for a in answers}) == 1
    assert await _rows(db) == (1, 4, 4, 1)
