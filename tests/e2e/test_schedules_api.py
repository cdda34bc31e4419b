"""``/schedules`` over real HTTP: create/replace, read, list, pause/resume, delete, the 422s of
invalid rules, and ticks turning into jobs through the stack's running sweeper."""

from __future__ import annotations

import asyncio
import time

from conveyor.core.config import Settings

from .. import db as tdb
from ..stack import running_stack

BAD = [
    ({"cron": "61 * * * *"}, "invalid_schedule"),
    ({"cron": "* * * *"}, "invalid_schedule"),
    ({"cron": "0 0 30 2 *"}, "invalid_schedule"),  # never matches
    ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "invalid_schedule"),
    ({"cron": "0 * * * *", "every_seconds": 60}, "invalid_schedule"),
    ({}, "invalid_schedule"),
    ({"every_seconds": 0.5}, "invalid_request"),
    ({"every_seconds": "60"}, "invalid_request"),
    ({"cron": "0 * * * *", "catch_up": "all"}, "invalid_request"),
    ({"cron": "0 * * * *", "name": "bad name"}, "invalid_request"),
    ({"cron": "0 * * * *", "type": "nobody_registered_this"}, "unknown_job_type"),
    ({"cron": "0 * * * *", "payload": {"s": "\x00"}}, "invalid_schedule"),
]


async def test_schedule_crud_and_errors(settings: Settings) -> None:
    async with running_stack(settings, maintenance=False) as stack:
        c = stack.client
        body = {"name": "nightly", "type": "t", "cron": "30 2 * * *",
                "timezone": "America/New_York", "payload": {"r": 1},
                "priority": "high"}  # fmt: skip
        created = await c.post("/schedules", json=body)
        assert created.status_code == 201, created.text
        s = created.json()
        assert (s["type"], s["priority"], s["enabled"], s["source"]) == ("t", 9, True, "api")
        assert s["next_run_at"] is not None and s["next_run_at"].endswith(("06:30:00Z",
            "07:30:00Z", "+00:00"))  # fmt: skip
        replaced = await c.post("/schedules", json={**body, "payload": {"r": 2}})
        assert replaced.status_code == 200 and replaced.json()["payload"] == {"r": 2}
        assert replaced.json()["next_run_at"] == s["next_run_at"]  # same rule: same tick
        got = await c.get("/schedules/nightly")
        assert got.status_code == 200 and got.json()["cron"] == "30 2 * * *"
        listed = (await c.get("/schedules")).json()["schedules"]
        assert [x["name"] for x in listed] == ["nightly"]
        paused = await c.post("/schedules/nightly/pause")
        assert paused.status_code == 200
        assert paused.json()["enabled"] is False and paused.json()["next_run_at"] is None
        resumed = await c.post("/schedules/nightly/resume")
        assert resumed.json()["enabled"] is True and resumed.json()["next_run_at"] is not None
        for extra, code in BAD:
            r = await c.post("/schedules", json={"name": "x", "type": "t", **extra})
            assert r.status_code == 422 and r.json()["error"] == code, (extra, r.text)
        # a body that is not even text (schemathesis sent b"\xff\r"): a documented 400
        documented = (await c.get("/openapi.json")).json()["paths"]["/schedules"]["post"]
        r = await c.post("/schedules", content=b"\xff\r",
                         headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"] == "malformed_json", r.text
        assert "400" in documented["responses"]
        assert (await c.delete("/schedules/nightly")).status_code == 204
        for method, path in (("GET", "/schedules/nightly"), ("DELETE", "/schedules/nightly"),
                             ("POST", "/schedules/nightly/pause")):  # fmt: skip
            r = await c.request(method, path)
            assert r.status_code == 404 and r.json()["error"] == "not_found"
        assert (await c.get("/schedules")).json() == {"schedules": []}


async def test_ticks_become_jobs_in_the_running_stack(settings: Settings) -> None:
    async with running_stack(settings) as stack:
        r = await stack.client.post(
            "/schedules", json={"name": "sec", "type": "t", "every_seconds": 1}
        )
        assert r.status_code == 201
        conn = await tdb.connect(settings.database_url)
        try:
            deadline = time.monotonic() + 15
            while await conn.fetchval("SELECT count(*) FROM jobs") < 3:
                assert time.monotonic() < deadline, "no jobs from the schedule"
                await asyncio.sleep(0.1)
            await stack.client.post("/schedules/sec/pause")
            rows = await conn.fetch(
                "SELECT meta->>'tick' AS tick, count(*) AS n FROM jobs GROUP BY 1"
            )
        finally:
            await conn.close()
        assert all(r["n"] == 1 for r in rows)
        last = (await stack.client.get("/schedules/sec")).json()
        assert last["last_job_id"] is not None and last["last_tick_at"] is not None
