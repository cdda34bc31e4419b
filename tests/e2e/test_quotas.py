"""Every unbounded input has a limit, tried with a hostile value over real HTTP by a
key that may submit (the per-key rate is in test_security.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from conveyor.core.config import Settings

from ..security import bearer, keyed_stack


async def test_each_limit_refuses_a_hostile_value(
    settings: Settings, db: asyncpg.Connection
) -> None:
    async with keyed_stack(settings, max_body_bytes=200_000, max_payload_bytes=10_000) as (
        stack,
        keys,
    ):
        c, h = stack.client, bearer(keys["jobs:read,jobs:write"])
        soon = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        far = (datetime.now(UTC) + timedelta(days=3651)).isoformat()
        refused = {
            "run_at in year 9000": ({"type": "t", "run_at": "9000-01-01T00:00:00Z"}, 422),
            "run_at past the horizon": ({"type": "t", "run_at": far}, 422),
            "delay over ten years": ({"type": "t", "delay_seconds": 10 * 366 * 86400}, 422),
            "max_retries 1001": ({"type": "t", "max_retries": 1001}, 422),
            "timeout of 8 days": ({"type": "t", "timeout_seconds": 8 * 86400.0}, 422),
            "payload over the limit": ({"type": "t", "payload": {"x": "a" * 10_001}}, 413),
        }
        for what, (body, status) in refused.items():
            r = await c.post("/jobs", json=body, headers=h)
            assert r.status_code == status, (what, r.status_code, r.text)
        two = {"jobs": [{"type": "t", "run_at": soon}, {"type": "t", "run_at": far}]}
        r = await c.post("/jobs/batch", json=two, headers=h)
        assert r.status_code == 422 and "jobs[1]" in r.text, r.text
        r = await c.post("/jobs", json={"type": "t"}, headers={**h, "Idempotency-Key": "k" * 256})
        assert r.status_code == 422, r.text
        r = await c.post("/jobs/batch", json={"jobs": [{"type": "t"}] * 1001}, headers=h)
        assert r.status_code == 422 and r.json()["error"] == "too_many_jobs"
        big = {"jobs": [{"type": "t", "payload": {"x": "a" * 9000}}] * 30}  # ~270 KB > 200 KB
        r = await c.post("/jobs/batch", json=big, headers=h)
        assert r.status_code == 413, r.status_code
        for limit in ("0", "501", "-1", "99999999999999999999"):
            assert (await c.get(f"/jobs?limit={limit}", headers=h)).status_code == 422, limit
        assert await db.fetchval("SELECT count(*) FROM jobs") == 0
        # the limits themselves are accepted
        ok = [{"type": "t", "run_at": soon}, {"type": "t", "max_retries": 1000},
              {"type": "t", "timeout_seconds": 7 * 86400.0}]  # fmt: skip
        for body in ok:
            assert (await c.post("/jobs", json=body, headers=h)).status_code == 201, body
        r = await c.post("/jobs", json={"type": "t"}, headers={**h, "Idempotency-Key": "k" * 255})
        assert r.status_code == 201
        assert (await c.get("/jobs?limit=500", headers=h)).status_code == 200
