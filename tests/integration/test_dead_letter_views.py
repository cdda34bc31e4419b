"""One concept, two places: a dead letter is a FAILED job (PostgreSQL, the
dashboard's page); the dead-letter queue holds a copy per failure (``conveyor dlq``). A redrive
or purge from either place leaves nothing stale in the other: ``dlq list`` shows only the copies
whose job is still FAILED at the attempt they recorded, and drops the others from the queue."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest

from conveyor import Job, JobRouter, cli
from conveyor.core.config import Settings

from ..faults.harness import component_env
from ..stack import Stack, running_stack, wait_for
from .broker_state import published, wait_metric

router = JobRouter()


@router.job("view_doomed", max_retries=0)
async def doomed(job: Job) -> None:
    raise ValueError("no such recipient")


@router.job("view_purged", max_retries=0)
async def purged(job: Job) -> None:
    raise ValueError("mailbox full")


FORM = {"content-type": "application/x-www-form-urlencoded"}


def _cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in component_env(settings).items():
        if name.startswith("CONVEYOR_"):
            monkeypatch.setenv(name, value)


async def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, list(argv)) == 0
    return capsys.readouterr().out


async def _dlq_list(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    out = await _run(capsys, "dlq", "list", "--json")
    return [orjson.loads(line) for line in out.splitlines()]


async def _failed_with_letters(stack: Stack, settings: Settings, *types: str) -> list[str]:
    jobs = [await stack.submit(t) for t in types]
    await wait_for(settings.database_url, jobs, statuses=["FAILED"])
    await wait_metric(lambda: published(stack.relay, "dead") >= len(jobs), what="dead letters")
    for w in stack.workers:
        await w.stop(grace=1)
    stack.workers.clear()
    return jobs


async def _dashboard(stack: Stack, action: str, job_type: str) -> None:
    c = stack.client
    page = await c.get("/ui/dead/confirm", params={"action": action, "type": job_type})
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert token is not None, page.text
    body = f"csrf={token.group(1)}&confirm=yes&type={job_type}"
    r = await c.post(f"/ui/dead/{action}", content=body, headers=FORM)
    assert r.status_code == 303, r.text


async def test_a_redrive_or_purge_on_the_dashboard_leaves_no_stale_letter_in_dlq_list(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cli_env(settings, monkeypatch)
    async with running_stack(settings, router) as stack:
        jobs = await _failed_with_letters(stack, settings, "view_doomed", "view_purged",
                                          "view_doomed")  # fmt: skip
        listed = await _dlq_list(capsys)
        assert {d["job_id"] for d in listed} == set(jobs)
        # the dashboard redrives every FAILED view_doomed job and purges view_purged
        await _dashboard(stack, "redrive", "view_doomed")
        await _dashboard(stack, "purge", "view_purged")
        assert "No dead letters." in (await stack.client.get("/ui/dead")).text
        listed = await _dlq_list(capsys)
        assert listed == [], listed
        # the stale copies are gone from the queue, not only hidden
        summary = orjson.loads(await _run(capsys, "dlq", "purge", "--all", "--yes"))
        assert summary == {"scanned": 0}, summary


async def test_a_redrive_by_dlq_leaves_nothing_on_the_dashboards_page(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cli_env(settings, monkeypatch)
    async with running_stack(settings, router) as stack:
        jobs = await _failed_with_letters(stack, settings, "view_doomed", "view_doomed")
        page = (await stack.client.get("/ui/dead")).text
        assert "view_doomed" in page and "no such recipient" in page
        summary = orjson.loads(await _run(capsys, "dlq", "redrive", "--all"))
        assert summary == {"scanned": 2, "redrive": 2}
        assert "No dead letters." in (await stack.client.get("/ui/dead")).text
        assert await _dlq_list(capsys) == []
        for job in jobs:
            assert (await stack.client.get(f"/jobs/{job}")).json()["status"] == "PENDING"
