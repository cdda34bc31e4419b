"""The dashboard's schedules page (/ui/schedules) in a real browser (Debian's Chromium driven by
Playwright): schedules with their rule, time zone, state and next tick; Pause, Resume and
Delete clicked, each checked in the database; a payload carrying markup shows as text; a POST
without the page's CSRF token is refused. With keys required, jobs:read sees the page without
the buttons and may not change a schedule (test_security.py's route matrix covers every key
and scope). Screenshot: schedules.png (docs/img with CONVEYOR_UI_SCREENSHOTS=docs/img)."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types
from examples.app import router as example_router

from ..security import bearer, keyed_stack
from ..stack import running_stack
from . import test_dashboard as dashboard

browser_page = dashboard.browser_page  # the fixture: Chromium through Playwright


async def _state(db: asyncpg.Connection, name: str) -> tuple[bool, object] | None:
    row = await db.fetchrow("SELECT enabled, next_run_at FROM schedules WHERE name = $1", name)
    return None if row is None else (row["enabled"], row["next_run_at"])


async def test_schedules_page_pause_resume_delete(
    settings: Settings, db: asyncpg.Connection, browser_page: object, tmp_path: Path
) -> None:
    p: object = browser_page
    goto, text, click = p.goto, p.inner_text, p.click  # type: ignore[attr-defined]
    await register_router_types(db, example_router)
    async with running_stack(settings, None, maintenance=False) as stack:
        base = str(stack.client.base_url)
        for body in (
            {"name": "nightly-report", "type": "hello", "cron": "0 3 * * *",
             "timezone": "Europe/Berlin", "payload": {"name": dashboard.XSS}},
            {"name": "poll-every-minute", "type": "poll_upstream", "every_seconds": 60},
        ):  # fmt: skip
            r = await stack.client.post("/schedules", json=body)
            assert r.status_code == 201, r.text

        await goto(f"{base}/ui")
        await click("nav >> text=Schedules")
        await p.wait_for_url("**/ui/schedules")  # type: ignore[attr-defined]
        header = (await text("#schedules thead")).split("\t")
        rows = {
            line.split("\t")[0]: dict(zip(header, line.split("\t"), strict=False))
            for line in (await text("#schedules tbody")).splitlines()
        }
        assert set(rows) == {"nightly-report", "poll-every-minute"}
        nightly = rows["nightly-report"]
        assert (nightly["rule"], nightly["time zone"], nightly["state"]) == (
            "0 3 * * *", "Europe/Berlin", "active"
        )  # fmt: skip
        assert rows["poll-every-minute"]["rule"] == "every 60 s"
        assert dashboard.XSS in nightly["payload"]  # text, not markup
        assert await p.evaluate("window.pwned === undefined")  # type: ignore[attr-defined]
        await p.screenshot(path=str(dashboard._shots(tmp_path) / "schedules.png"), full_page=True)  # type: ignore[attr-defined]

        form = "#schedules form[action='/ui/schedules/nightly-report/{}'] button"
        await click(form.format("pause"))
        await p.wait_for_url("**/ui/schedules?done=*")  # type: ignore[attr-defined]
        assert "nightly-report paused" in await text("#done")
        assert await _state(db, "nightly-report") == (False, None)

        await click(form.format("resume"))
        await p.wait_for_url("**/ui/schedules?done=*")  # type: ignore[attr-defined]
        state = await _state(db, "nightly-report")
        assert state is not None and state[0] is True and state[1] is not None

        await click(form.format("delete"))
        await p.wait_for_url("**/ui/schedules?done=*")  # type: ignore[attr-defined]
        assert await _state(db, "nightly-report") is None
        assert await _state(db, "poll-every-minute") is not None
        assert "nightly-report" not in await text("#schedules tbody")

        # a POST without the page's CSRF token changes nothing
        r = await stack.client.post(
            "/ui/schedules/poll-every-minute/pause", data={"go": "1"},
            headers={"origin": base},
        )  # fmt: skip
        assert r.status_code == 403, r.status_code
        assert await _state(db, "poll-every-minute") is not None
        assert (await _state(db, "poll-every-minute") or (None,))[0] is True


async def test_schedules_page_with_keys(settings: Settings, db: asyncpg.Connection) -> None:
    """Keys required: jobs:read sees the schedules without a button and may not change one;
    admin may (over HTTP with a bearer key, which needs no CSRF token: no cookie rides along)."""
    await register_router_types(db, example_router)
    async with keyed_stack(settings) as (stack, keys):
        c = stack.client
        r = await c.post("/schedules", json={"name": "tick", "type": "hello", "every_seconds": 5},
                         headers=bearer(keys["admin"]))  # fmt: skip
        assert r.status_code == 201, r.text
        assert (await c.get("/ui/schedules")).status_code == 401
        page = await c.get("/ui/schedules", headers=bearer(keys["jobs:read"]))
        assert page.status_code == 200 and "tick" in page.text
        assert "/ui/schedules/tick/pause" not in page.text
        r = await c.post("/ui/schedules/tick/pause", headers=bearer(keys["jobs:read"]))
        assert r.status_code == 403 and await _state(db, "tick") is not None
        assert (await _state(db, "tick") or (None,))[0] is True
        page = await c.get("/ui/schedules", headers=bearer(keys["admin"]))
        assert "/ui/schedules/tick/pause" in page.text
        r = await c.post("/ui/schedules/tick/pause", headers=bearer(keys["admin"]))
        assert r.status_code == 303, r.text
        assert (await _state(db, "tick") or (None,))[0] is False
