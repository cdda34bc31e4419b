"""``conveyor dev`` is a laptop: a failed attempt's whole traceback is in the API's answer, on
the dashboard's job page and in the log, down to the line that raised (the log had cut it after
300 characters, and the API and the page hid it unless CONVEYOR_API_EXPOSE_TRACEBACKS was
set). A production worker's log line names the error and where it was raised."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from conveyor.core.config import Settings

from ..stack import free_port
from .test_process_states import _env, conveyor

pytestmark = pytest.mark.timeout(120)

RAISING_LINE = "raise RuntimeError(f\"card declined for order {job.payload.get('order', '?')}\")"


async def test_dev_shows_whole_tracebacks(settings: Settings) -> None:
    port = free_port()
    args = ["dev", "--app", "examples.app:router", "--port", str(port)]
    async with conveyor(args, _env(settings)) as proc:
        await proc.wait_for_line(lambda line: "Ctrl-C stops it" in line)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.post("/jobs", json={"type": "never_succeeds", "payload": {"order": 7}})
            job_id = r.json()["id"]
            deadline = time.monotonic() + 60
            while True:
                job = (await client.get(f"/jobs/{job_id}")).json()
                if job["last_error"]:
                    break
                assert time.monotonic() < deadline, job
                await asyncio.sleep(0.1)
            assert job["last_error"] == "RuntimeError: card declined for order 7"
            traceback = job["last_error_traceback"]
            assert traceback and "Traceback (most recent call last)" in traceback, job
            assert RAISING_LINE in traceback, traceback
            attempts = (await client.get(f"/jobs/{job_id}/attempts")).json()["attempts"]
            assert RAISING_LINE in attempts[0]["error"], attempts
            page = (await client.get(f"/ui/jobs/{job_id}")).text
            assert "Traceback (most recent call last)" in page, page[-3000:]
        await proc.wait_for_line(lambda line: RAISING_LINE in line, timeout=10)
    text = "".join(proc.lines)
    failed = next(line for line in proc.lines if "job_attempt_failed" in line)
    assert 'error="RuntimeError: card declined for order 7"' in failed, failed
    assert 'at="' in failed and "examples/app.py" in failed, failed  # where it was raised
    below = text[text.index(failed) + len(failed) :]
    assert below.lstrip().startswith("Traceback (most recent call last)"), below[:500]
