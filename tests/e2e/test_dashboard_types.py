"""The dashboard's job-types page (/ui/types) in a real browser (Debian's Chromium driven by
Playwright): each registered type with its handler's defaults and its jobs by status, linked
to the jobs page; a type name is text, never markup. Screenshot: types.png (docs/img with
CONVEYOR_UI_SCREENSHOTS=docs/img)."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from conveyor import JobSpec, enqueue_many
from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types
from examples.app import router as example_router

from ..stack import running_stack
from . import test_dashboard as dashboard

browser_page = dashboard.browser_page  # the fixture: Chromium through Playwright


async def test_types_page_shows_defaults_and_counts(
    settings: Settings, db: asyncpg.Connection, browser_page: object, tmp_path: Path
) -> None:
    p: object = browser_page
    goto, text = p.goto, p.inner_text  # type: ignore[attr-defined]
    await db.execute("DELETE FROM job_types")  # the example app's types only
    await register_router_types(db, example_router)
    emails = [JobSpec("send_email", {"to": f"{i}@example.com"}) for i in range(4)]
    ids = await enqueue_many(db, [*emails, JobSpec("hello", delay_seconds=600)])
    await db.execute("UPDATE jobs SET status = 'FAILED', last_error = 'SMTPError: 550' "
                     "WHERE id = $1", ids[0])  # fmt: skip
    async with running_stack(settings, None, maintenance=False) as stack:
        base = str(stack.client.base_url)
        await goto(f"{base}/ui")
        await p.click("nav >> text=Types")  # type: ignore[attr-defined]
        await p.wait_for_url("**/ui/types")  # type: ignore[attr-defined]
        rows = {
            line.split("\t")[0]: line.split("\t")
            for line in (await text("#types tbody")).splitlines()
        }
        assert set(rows) == {
            "never_succeeds",
            "hello",
            "poll_upstream",
            "resize_image",
            "send_email",
            "sync_account",
        }
        header = (await text("#types thead")).split("\t")
        email = dict(zip(header, rows["send_email"], strict=True))
        assert email["max retries"] == "5" and email["timeout"] == "30 s"
        assert email["retry delays"] == "1 s, 5 s, 30 s"
        assert (email["pending"], email["failed"], email["in progress"]) == ("3", "1", "0")
        hello = dict(zip(header, rows["hello"], strict=True))
        assert hello["scheduled"] == "1" and hello["retry delays"] == "backoff"
        assert dict(zip(header, rows["poll_upstream"], strict=True))["timeout"] == "none"
        await p.screenshot(path=str(dashboard._shots(tmp_path) / "types.png"), full_page=True)  # type: ignore[attr-defined]

        # a count links to those jobs
        await p.click("#types a[href='/ui/jobs?type=send_email&status=FAILED']")  # type: ignore[attr-defined]
        await p.wait_for_url("**/ui/jobs?type=send_email&status=FAILED")  # type: ignore[attr-defined]
        assert str(ids[0]) in await text("#jobs")

        # a name that is markup shows as text (job_types is written by workers and deploys)
        await db.execute("INSERT INTO job_types (name, max_retries) VALUES ($1, 1)", dashboard.XSS)
        await goto(f"{base}/ui/types")
        assert dashboard.XSS in await text("#types")
        assert await p.evaluate("window.pwned === undefined")  # type: ignore[attr-defined]
