"""The batch insert runs without the command timeout (a long statement is not an outage), so
its 503 on a hung server comes from the liveness probe: within seconds, and the connection
that held the abandoned statement is never reused."""

from __future__ import annotations

import asyncio
import time

import pytest

from conveyor.core.config import Settings

from .harness import fault_settings, running
from .infra import PrivatePostgres


@pytest.fixture
def psettings(settings: Settings, private_db_url: str) -> Settings:
    return fault_settings(settings, database_url=private_db_url)


@pytest.mark.timeout(60)
async def test_a_batch_on_a_hung_server_is_a_503_within_2s(
    psettings: Settings, private_pg: PrivatePostgres
) -> None:
    batch = {"jobs": [{"type": "work", "payload": {"i": i}} for i in range(200)]}
    async with running(psettings) as stack:
        warm = await asyncio.gather(
            *(stack.client.post("/jobs/batch", json=batch) for _ in range(4))
        )  # pooled connections open
        assert {r.status_code for r in warm} == {201}
        frozen = await asyncio.to_thread(private_pg.freeze)
        try:
            t0 = time.monotonic()
            r = await stack.client.post("/jobs/batch", json=batch, timeout=10)
            took = time.monotonic() - t0
        finally:
            private_pg.thaw(frozen)
        print(f"[faults] batch on a hung PostgreSQL: {r.status_code} in {took:.2f}s")
        assert r.status_code == 503 and r.json()["error"] == "service_unavailable", r.text
        # the batch is answered once the liveness probe fails on the hung server, within the
        # probe's own timeout; the bound leaves room for a loaded machine (without the probe the
        # batch would wait out its statement: minutes)
        assert took < 4.0, took
        again = await asyncio.gather(
            *(stack.client.post("/jobs/batch", json=batch) for _ in range(4))
        )
        assert {a.status_code for a in again} == {201}, [a.text[:200] for a in again]
