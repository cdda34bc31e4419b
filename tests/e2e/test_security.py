"""API keys and scopes over real HTTP: every route x {no key, bad key, wrong scope, right scope},
keys only in the Authorization header, revocation on every replica within 5 s, the per-key
submit quota, and no key in logs, error bodies, /metrics or OpenAPI."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import APIRouter

from conveyor.api.auth import OPEN, ROUTE_SCOPES
from conveyor.cli.keys import create_key, revoke_key
from conveyor.cli.processes import api_server, serve_api
from conveyor.core.config import Settings

from ..security import BAD_KEYS, IMPLIED_BY, RIGHT, WRONG, bearer, keyed_stack, make_keys, required
from ..stack import free_port, running_stack

Req = tuple[str, str, dict[str, Any]]


def _requests(job: str, cancelled: str, wf: str) -> dict[tuple[str, str], tuple[Req, int]]:
    """(method, template) → (a request, its status with the right scope)."""
    form = {"headers": {"content-type": "application/x-www-form-urlencoded"}}
    batch = {"json": {"jobs": [{"type": "e"}]}}
    return {
        ("POST", "/jobs"): (("POST", "/jobs", {"json": {"type": "echo"}}), 201),
        ("POST", "/jobs/batch"): (("POST", "/jobs/batch", batch), 201),
        ("GET", "/jobs"): (("GET", "/jobs", {}), 200),
        ("GET", "/jobs/{job_id}"): (("GET", f"/jobs/{job}", {}), 200),
        ("GET", "/jobs/{job_id}/attempts"): (("GET", f"/jobs/{job}/attempts", {}), 200),
        ("POST", "/jobs/{job_id}/cancel"): (("POST", f"/jobs/{job}/cancel", {}), 409),
        ("POST", "/jobs/{job_id}/retry"): (("POST", f"/jobs/{cancelled}/retry", {}), 200),
        ("POST", "/workflows"): (("POST", "/workflows", {"json": WORKFLOW}), 201),
        ("GET", "/workflows"): (("GET", "/workflows", {}), 200),
        ("GET", "/workflows/{workflow_id}"): (("GET", f"/workflows/{wf}", {}), 200),
        ("POST", "/workflows/{workflow_id}/cancel"): (
            ("POST", f"/workflows/{wf}/cancel", {}), 200),
        ("GET", "/ui"): (("GET", "/ui", {}), 200),
        ("GET", "/ui/fragment/overview"): (("GET", "/ui/fragment/overview", {}), 200),
        ("GET", "/ui/jobs"): (("GET", "/ui/jobs", {}), 200),
        ("GET", "/ui/jobs/{job_id}"): (("GET", f"/ui/jobs/{job}", {}), 200),
        ("POST", "/ui/jobs/{job_id}/cancel"): (("POST", f"/ui/jobs/{job}/cancel", form), 303),
        ("POST", "/ui/jobs/{job_id}/retry"): (("POST", f"/ui/jobs/{job}/retry", form), 303),
        ("GET", "/ui/dead"): (("GET", "/ui/dead", {}), 200),
        ("GET", "/ui/dead/confirm"): (("GET", "/ui/dead/confirm?action=purge&type=e", {}), 200),
        ("POST", "/ui/dead/redrive"): (
            ("POST", "/ui/dead/redrive", {**form, "content": "confirm=yes&type=e"}), 303),
        ("POST", "/ui/dead/purge"): (
            ("POST", "/ui/dead/purge", {**form, "content": "confirm=yes&type=e"}), 303),
        # job types ("echo" registered) and schedules (one per changing route, made first)
        ("GET", "/types"): (("GET", "/types", {}), 200),
        ("POST", "/types/{name}/pause"): (("POST", "/types/echo/pause", {}), 200),
        ("POST", "/types/{name}/resume"): (("POST", "/types/echo/resume", {}), 200),
        ("PUT", "/types/{name}/limits"): (
            ("PUT", "/types/echo/limits", {"json": {"concurrency": 3}}), 200),
        ("GET", "/types/{name}/partitions"): (("GET", "/types/echo/partitions", {}), 200),
        ("PUT", "/types/{name}/partitions/{key}"): (
            ("PUT", "/types/echo/partitions/a%2Fb", {"json": {"paused": True}}), 200),
        ("GET", "/schedules"): (("GET", "/schedules", {}), 200),
        ("GET", "/schedules/{name}"): (("GET", "/schedules/m-get", {}), 200),
        ("POST", "/schedules"): (("POST", "/schedules", {"json": _schedule("m-new")}), 201),
        ("DELETE", "/schedules/{name}"): (("DELETE", "/schedules/m-del", {}), 204),
        ("POST", "/schedules/{name}/pause"): (("POST", "/schedules/m-pause/pause", {}), 200),
        ("POST", "/schedules/{name}/resume"): (("POST", "/schedules/m-resume/resume", {}), 200),
        ("GET", "/ui/types"): (("GET", "/ui/types", {}), 200),
        ("GET", "/ui/workflows"): (("GET", "/ui/workflows", {}), 200),
        ("GET", "/ui/workflows/{workflow_id}"): (("GET", f"/ui/workflows/{wf}", {}), 200),
        ("GET", "/ui/schedules"): (("GET", "/ui/schedules", {}), 200),
        ("POST", "/ui/schedules/{name}/pause"): (
            ("POST", "/ui/schedules/m-ui-pause/pause", form), 303),
        ("POST", "/ui/schedules/{name}/resume"): (
            ("POST", "/ui/schedules/m-ui-resume/resume", form), 303),
        ("POST", "/ui/schedules/{name}/delete"): (
            ("POST", "/ui/schedules/m-ui-delete/delete", form), 303),
    }  # fmt: skip


WORKFLOW = {"name": "w", "jobs": [{"key": "k", "type": "echo"}]}
SCHEDULES = ("m-get", "m-del", "m-pause", "m-resume", "m-ui-pause", "m-ui-resume", "m-ui-delete")


def _schedule(name: str) -> dict[str, Any]:
    return {"name": name, "type": "echo", "every_seconds": 3600}


async def test_every_route_by_key(settings: Settings, db: asyncpg.Connection) -> None:
    """Every route of the table: the expected status for each case, the right scope's included
    (a route added later and not in ``_requests`` fails here until it is)."""
    await db.execute(
        "INSERT INTO job_types (name, max_retries) VALUES ('echo', 1) ON CONFLICT DO NOTHING"
    )
    async with keyed_stack(settings) as (stack, keys):
        c = stack.client
        for name in SCHEDULES:
            r = await c.post("/schedules", json=_schedule(name), headers=bearer(keys["admin"]))
            assert r.status_code == 201, r.text
        r = await c.post("/jobs", json={"type": "echo"}, headers=bearer(keys["jobs:write"]))
        job = r.json()["id"]
        r = await c.post("/jobs", json={"type": "echo"}, headers=bearer(keys["jobs:write"]))
        cancelled = r.json()["id"]
        r = await c.post(f"/jobs/{cancelled}/cancel", headers=bearer(keys["jobs:write"]))
        assert r.status_code == 200, r.text
        await c.post(f"/jobs/{job}/cancel", headers=bearer(keys["jobs:write"]))
        r = await c.post("/workflows", json=WORKFLOW, headers=bearer(keys["jobs:write"]))
        specific = _requests(job, cancelled, r.json()["id"])
        rows, failures = [], []
        for (method, path), need in sorted(ROUTE_SCOPES.items()):
            if need == OPEN:
                continue
            entry = specific.get((method, path))
            if entry is None:
                failures.append((method, path, need, "no request with its expected status"))
                continue
            (m, url, kw), ok = entry
            kw = dict(kw)
            base_headers = kw.pop("headers", {})
            got = {}
            cases = [("none", None), *[(f"bad{i}", k) for i, k in enumerate(BAD_KEYS)],
                     *([("wrong", keys[WRONG[need]])] if need in WRONG else []),
                     ("right", keys[RIGHT[need]]),
                     *([("implied", keys[IMPLIED_BY[need]])] if need in IMPLIED_BY
                       else [])]  # fmt: skip
            for case, key in cases:
                headers = dict(base_headers)
                if key is not None:
                    headers["Authorization"] = f"Bearer {key}"
                resp = await c.request(m, url, headers=headers, **kw)
                got[case] = resp.status_code
                if resp.status_code == 401:
                    assert resp.headers["www-authenticate"].startswith("Bearer"), (path, case)
            expect = {c: 401 for c in got} | ({"wrong": 403} if need in WRONG else {})
            expect |= {"right": ok} | ({"implied": ok} if need in IMPLIED_BY else {})
            if got != expect:
                failures.append((method, path, need, got, expect))
            rows.append(f"{method:5} {path:28} {need:10} " + " ".join(f"{got[k]}" for k in got))
        print("\n".join(["route x {none, badx4, wrong, right, implied}:", *rows]))
        assert not failures, failures
        assert len(rows) == sum(1 for s in ROUTE_SCOPES.values() if s != OPEN)


async def test_open_routes_and_no_query_string_keys(settings: Settings) -> None:
    async with keyed_stack(settings) as (stack, keys):
        c = stack.client
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
            for headers in ({}, bearer(BAD_KEYS[0]), bearer(keys["jobs:read"])):
                assert (await c.get(path, headers=headers)).status_code == 200, path
        key = keys["jobs:read"]
        for query in ("access_token", "key", "api_key", "token", "authorization"):
            r = await c.get(f"/jobs?{query}={key}")
            assert r.status_code in (401, 422), (query, r.status_code)  # never accepted
            assert key not in r.text
        r = await c.get("/jobs", headers={"Authorization": f"Basic {key}"})
        assert r.status_code == 401
        r = await c.get("/jobs", headers={"Authorization": f"bearer {key}"})  # scheme: any case
        assert r.status_code == 200


async def test_metrics_behind_a_key_when_asked(settings: Settings) -> None:
    async with keyed_stack(settings, metrics_auth="required") as (stack, keys):
        c = stack.client
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/metrics", headers=bearer(keys["jobs:read"]))).status_code == 200
        # every scope includes jobs:read: any valid key reads the metrics
        assert (await c.get("/metrics", headers=bearer(keys["jobs:write"]))).status_code == 200
        assert (await c.get("/healthz")).status_code == 200


async def test_a_revoked_key_is_refused_by_every_replica_within_5s(settings: Settings) -> None:
    s = required(settings, accept_unknown_types=True)
    key = await create_key(s, "rotating", "jobs:read,jobs:write")
    stop = asyncio.Event()
    ports = [free_port(), free_port()]
    servers = [api_server(s, "127.0.0.1", p) for p in ports]
    tasks = [asyncio.create_task(serve_api(srv, stop)) for srv in servers]
    try:
        while not all(srv.started for srv in servers):
            await asyncio.sleep(0.01)
        clients = [httpx.AsyncClient(base_url=f"http://127.0.0.1:{p}") for p in ports]
        for c in clients:
            for _ in range(50):
                assert (await c.get("/jobs", headers=bearer(key))).status_code == 200
        # 100 requests, a few key reads: no PostgreSQL round trip per request
        reads = [srv.config.app.state.auth.keys.reads for srv in servers]
        assert all(1 <= n <= 3 for n in reads), reads
        assert await revoke_key(s, "rotating") == 1
        t0 = time.monotonic()
        refused_after = []
        for c in clients:
            while (await c.get("/jobs", headers=bearer(key))).status_code != 401:
                assert time.monotonic() - t0 < 5, "still accepted 5 s after the revocation"
                await asyncio.sleep(0.05)
            refused_after.append(round(time.monotonic() - t0, 2))
        print(f"[security] revoked key refused by both replicas after {refused_after} s")
        for c in clients:
            await c.aclose()
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_submit_quota_per_key(settings: Settings, db: asyncpg.Connection) -> None:
    """5 a minute: a burst of 5, then 429 with Retry-After (a refill takes 12 s, so load on the
    machine cannot blur the count; the refill itself is tested on an injected clock)."""
    async with keyed_stack(settings, rate_limit="5/m") as (stack, keys):
        c = stack.client
        a, b = bearer(keys["jobs:write"]), bearer(keys["jobs:read,jobs:write"])
        statuses = [(await c.post("/jobs", json={"type": "e"}, headers=a)).status_code
                    for _ in range(8)]  # fmt: skip
        assert statuses == [201] * 5 + [429] * 3, statuses
        r = await c.post("/jobs/batch", json={"jobs": [{"type": "e"}]}, headers=a)
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 12, r.headers
        assert r.json()["error"] == "rate_limited"
        assert (await c.post("/jobs", json={"type": "e"}, headers=b)).status_code == 201
        assert (await c.get("/jobs", headers=b)).status_code == 200  # reads are not limited
        assert await db.fetchval("SELECT count(*) FROM jobs") == 6


async def test_no_key_in_logs_bodies_metrics_or_openapi(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with keyed_stack(settings) as (stack, keys):
        c = stack.client
        key = keys["admin"]
        texts = []
        for method, url in [("POST", "/jobs"), ("GET", "/jobs"), ("GET", "/nope"),
                            ("GET", "/jobs/not-a-uuid"), ("POST", "/jobs/batch")]:  # fmt: skip
            for k in (key, key[:-1] + "x", "cvk_0123456789ab_" + "A" * 43):
                r = await c.request(method, url, headers=bearer(k), content=b"{")
                texts.append(r.text)
                assert k not in r.text and k not in str(r.headers)
        texts.append((await c.get("/metrics")).text)
        texts.append((await c.get("/openapi.json")).text)
    logged = "\n".join(rec.getMessage() + str(rec.__dict__) for rec in caplog.records)
    assert "http_request" in logged  # the access log ran
    secret = key.split("_", 2)[2]
    for text in [*texts, logged]:
        assert secret not in text


async def test_a_router_included_later_is_guarded_too(settings: Settings) -> None:
    """Routes that do not come from the app's guarded route class (an ``APIRouter`` included
    with ``include_router``, as a dashboard page split into its own module would be) still run
    ``Auth``, and need ``admin`` since the table does not declare them: fail closed, as the
    app-wide dependency did before the guarded route class."""
    s = required(settings, accept_unknown_types=True)
    keys = await make_keys(s)
    server = api_server(s, "127.0.0.1", free_port())
    extra, ui = APIRouter(), APIRouter(prefix="/ui")

    @extra.get("/jobs-export")
    async def export() -> dict[str, str]:
        return {"secret": "every job"}

    @ui.get("/extra")
    async def ui_extra() -> dict[str, str]:
        return {"secret": "a dashboard page"}

    server.config.app.include_router(extra)
    server.config.app.include_router(ui)
    stop = asyncio.Event()
    task = asyncio.create_task(serve_api(server, stop))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.config.port}") as c:
            got = {}
            for path in ("/jobs-export", "/ui/extra"):
                for case, headers in (("none", {}), ("bad", bearer(BAD_KEYS[0])),
                                      ("read", bearer(keys["jobs:read"])),
                                      ("write", bearer(keys["jobs:read,jobs:write"])),
                                      ("admin", bearer(keys["admin"]))):  # fmt: skip
                    r = await c.get(path, headers=headers)
                    got[path, case] = r.status_code
                    assert r.status_code == 200 or "secret" not in r.text, (path, case)
        want = {"none": 401, "bad": 401, "read": 403, "write": 403, "admin": 200}
        assert got == {(p, c): want[c] for p, c in got}, got
    finally:
        stop.set()
        await task


async def test_the_submit_quota_is_fleet_wide(settings: Settings, db: asyncpg.Connection) -> None:
    """Two API replicas, one key, 5 a minute: the key gets 5 submits in all, not 5 per replica
    (the quota was per process: N replicas admitted N times the rate). The buckets live in
    PostgreSQL (tests/unit/test_security_parts.py: a statement per chunk of tokens)."""
    s = required(settings, accept_unknown_types=True, rate_limit="5/m")
    keys = await make_keys(s)
    stop = asyncio.Event()
    servers = [api_server(s, "127.0.0.1", free_port()) for _ in range(2)]
    tasks = [asyncio.create_task(serve_api(srv, stop)) for srv in servers]
    try:
        while not all(srv.started for srv in servers):
            await asyncio.sleep(0.01)
        clients = [httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.config.port}")
                   for srv in servers]  # fmt: skip
        try:
            a, b = bearer(keys["jobs:write"]), bearer(keys["jobs:read,jobs:write"])
            statuses = []
            for i in range(12):
                r = await clients[i % 2].post("/jobs", json={"type": "e"}, headers=a)
                statuses.append(r.status_code)
                if r.status_code == 429:
                    assert 1 <= int(r.headers["retry-after"]) <= 12, r.headers
            assert sorted(statuses) == [201] * 5 + [429] * 7, statuses
            assert (
                await clients[1].post("/jobs", json={"type": "e"}, headers=b)
            ).status_code == 201
        finally:
            for c in clients:
                await c.aclose()
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert await db.fetchval("SELECT count(*) FROM jobs") == 6
    # a refused key is refused locally for a window: not a statement per refused submit
    limiter = servers[0].config.app.state.auth.limiter
    assert limiter.round_trips <= 8, limiter.round_trips


async def test_a_key_that_submits_reads_its_jobs(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """Writing jobs includes reading them: a ``jobs:write`` key submits with the client, waits
    for the job to finish and reads its attempts and the job list (``wait`` answers no 403)."""
    from conveyor import Job, JobRouter
    from conveyor.client import Client
    from conveyor.jobs.types import register_router_types

    router = JobRouter()

    @router.job("writer_echo")
    async def echo(job: Job) -> dict[str, Any]:
        return dict(job.payload)

    await register_router_types(db, router)
    s = required(settings)
    key = await create_key(s, "writer-only", "jobs:write")
    async with running_stack(s, router) as stack:
        base = str(stack.client.base_url)

        def use() -> tuple[str, Any, int]:
            with Client(base, api_key=key) as c:
                job = c.submit("writer_echo", {"n": 1})
                done = c.wait(job.id, timeout=30)
                assert any(j.id == job.id for j in c.list(type="writer_echo").jobs)
                return done.status, done.result, done.attempts

        assert await asyncio.to_thread(use) == ("COMPLETED", {"n": 1}, 1)
        r = await stack.client.get("/types", headers=bearer(key))
        assert r.status_code == 200, r.text
