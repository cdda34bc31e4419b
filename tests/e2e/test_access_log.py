"""One access-log line per request: method, path template, status, duration; never the raw
path's id, the query string or a header."""

from __future__ import annotations

import logging
import uuid

import pytest

from conveyor.core.config import Settings

from ..stack import running_stack


async def test_access_log_names_the_route_template_only(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.access")
    async with running_stack(settings, None, maintenance=False) as stack:
        job_id = await stack.submit("noop", {"secret": "payload-value"})
        r = await stack.client.get(f"/jobs/{job_id}?token=query-secret",
                                   headers={"X-Api-Key": "key-secret"})  # fmt: skip
        assert r.status_code == 200
        assert (await stack.client.get(f"/jobs/{uuid.uuid4()}")).status_code == 404
    lines = [rec.fields for rec in caplog.records if rec.name == "conveyor.access"]  # type: ignore[attr-defined]
    assert [(f["method"], f["path"], f["status"]) for f in lines] == [
        ("POST", "/jobs", 201), ("GET", "/jobs/{job_id}", 200), ("GET", "/jobs/{job_id}", 404),
    ]  # fmt: skip
    assert all(f["duration_ms"] >= 0 for f in lines)
    text = caplog.text + repr(lines)
    for secret in (job_id, "query-secret", "key-secret", "payload-value"):
        assert secret not in text
