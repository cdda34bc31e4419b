"""The dashboard in a real browser (Debian's Chromium driven by Playwright): each page loads,
cancel / retry / bulk redrive act on the database, text from jobs is escaped, the overview
refreshes itself. Screenshots go to $CONVEYOR_UI_SCREENSHOTS (docs/img for docs/operations.md)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from conveyor.core.config import Settings

from .. import apps
from ..security import bearer, make_keys, required
from ..stack import Stack, running_stack, wait_for

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip
XSS = "<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def browser_page(tmp_path: Path) -> AsyncIterator[object]:
    playwright = pytest.importorskip("playwright.async_api")
    if not shutil.which(CHROMIUM):
        pytest.fail("chromium missing: apt-get install chromium chromium-driver (.ci/run does)")
    async with playwright.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        yield page
        await browser.close()


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("CONVEYOR_UI_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


async def _attempts(db: asyncpg.Connection, job_id: str) -> int:
    return int(await db.fetchval("SELECT attempts FROM jobs WHERE id = $1", uuid.UUID(job_id)))


async def test_dashboard_drives_a_job_life_and_a_bulk_redrive(
    settings: Settings, db_url: str, db: asyncpg.Connection, browser_page: object,
    tmp_path: Path,
) -> None:  # fmt: skip
    page: object = browser_page
    shots = _shots(tmp_path)
    apps.reset()
    async with running_stack(settings, apps.router, concurrency=8) as stack:
        base = str(stack.client.base_url)
        echo = await stack.submit("echo", {"note": XSS})
        failed = [await stack.submit("always_fails", {"n": i}, max_retries=0) for i in range(3)]
        slow = await stack.submit("slow", {"seconds": 60, "observe_cancel": True})
        await wait_for(db_url, [echo, *failed], timeout=30)
        await wait_for(db_url, [slow], statuses=["IN_PROGRESS"], timeout=30)
        await _drive(page, base, stack, db, db_url, shots, echo, failed, slow)


async def _drive(
    page: object, base: str, stack: Stack, db: asyncpg.Connection, db_url: str, shots: Path,
    echo: str, failed: list[str], slow: str,
) -> None:  # fmt: skip
    p: object = page
    goto, text = p.goto, p.inner_text  # type: ignore[attr-defined]

    # overview: one row per type, live refresh replaces the table
    await goto(f"{base}/ui")
    overview = await text("#overview")
    assert "always_fails" in overview and "echo" in overview
    # polled from outside: the page's CSP forbids the eval that wait_for_function would need
    for _ in range(150):
        if await p.get_attribute("#live", "data-refreshed"):  # type: ignore[attr-defined]
            break
        await p.wait_for_timeout(100)  # type: ignore[attr-defined]
    assert await p.get_attribute("#live", "data-refreshed")  # type: ignore[attr-defined]
    await p.screenshot(path=str(shots / "overview.png"), full_page=True)  # type: ignore[attr-defined]

    # jobs: filter by type, find by id
    await goto(f"{base}/ui/jobs?type=always_fails")
    rows = await text("#jobs")
    assert all(f in rows for f in failed) and echo not in rows
    await p.screenshot(path=str(shots / "jobs.png"), full_page=True)  # type: ignore[attr-defined]
    await p.fill("input[name=id]", echo)  # type: ignore[attr-defined]
    await p.click("text=Find")  # type: ignore[attr-defined]
    await p.wait_for_url(f"**/ui/jobs/{echo}")  # type: ignore[attr-defined]

    # one job: the payload's markup is shown as text and never runs
    assert XSS in await text("#payload") and XSS in await text("#result")
    assert await p.evaluate("window.pwned === undefined")  # type: ignore[attr-defined]
    assert "completed" in await text("#attempts")
    await p.screenshot(path=str(shots / "job.png"), full_page=True)  # type: ignore[attr-defined]

    # cancel a running job
    await goto(f"{base}/ui/jobs/{slow}")
    await p.click("button:has-text('Cancel')")  # type: ignore[attr-defined]
    assert (await wait_for(db_url, [slow], timeout=30))[uuid.UUID(slow)] == "CANCELLED"

    # retry a failed job: a second attempt runs (and fails again)
    await goto(f"{base}/ui/jobs/{failed[0]}")
    await p.click("button:has-text('Retry')")  # type: ignore[attr-defined]
    for _ in range(200):
        if await _attempts(db, failed[0]) == 2:
            break
        await p.wait_for_timeout(50)  # type: ignore[attr-defined]
    await wait_for(db_url, [failed[0]], statuses=["FAILED"], timeout=30)
    assert await _attempts(db, failed[0]) == 2

    # dead letters: grouped by type and error; bulk redrive after a confirmation
    await goto(f"{base}/ui/dead")
    dead = await text("#dead")
    assert "always_fails" in dead and "ValueError" in dead
    await p.screenshot(path=str(shots / "dead-letters.png"), full_page=True)  # type: ignore[attr-defined]
    await p.click("#dead >> text=Redrive…")  # type: ignore[attr-defined]
    # largest group first: the two jobs whose only attempt failed with the same error
    confirm = await text("#confirm-text")
    assert "2 FAILED job(s)" in confirm and "always fails (attempt 1)" in confirm
    await p.screenshot(path=str(shots / "confirm.png"), full_page=True)  # type: ignore[attr-defined]
    await p.click("button:has-text('Yes, redrive')")  # type: ignore[attr-defined]
    assert "redrive: 2 job(s)" in await text("#done")
    await wait_for(db_url, failed, statuses=["FAILED"], timeout=30)  # ran again, failed again
    assert [await _attempts(db, j) for j in failed] == [2, 2, 2]


TRACEBACK = (
    'Traceback (most recent call last):\n  File "/srv/secret/handlers.py", line 9, in run\n'
    "    raise ValueError(x)\nValueError: bad input"
)


async def test_dashboard_login_csrf_and_scopes_with_auth_required(
    settings: Settings, db: asyncpg.Connection, browser_page: object
) -> None:
    """Auth required: /ui answers 401 with a login form; a bad key is refused, a good one logs
    in (HttpOnly, SameSite=Strict cookie); a forged CSRF token is refused and the page's own
    works; a jobs:read key sees no actions and no traceback (admin sees the whole text); markup
    in a payload never runs."""
    p: Any = browser_page
    s = required(settings, accept_unknown_types=True)
    keys = await make_keys(s)
    async with running_stack(s, None, maintenance=False, relays=0) as stack:
        base = str(stack.client.base_url)
        r = await stack.client.post("/jobs", json={"type": "x", "payload": {"note": XSS}},
                                    headers=bearer(keys["jobs:write"]))  # fmt: skip
        job = r.json()["id"]
        await db.execute("UPDATE jobs SET last_error = $2 WHERE id = $1", uuid.UUID(job), TRACEBACK)

        async def login(key: str, ok: bool = True) -> None:
            response = await p.goto(f"{base}/ui/jobs/{job}")
            assert response.status == 401 and await p.is_visible("#login")
            assert "script-src 'self'" in response.headers["content-security-policy"]
            await p.fill("input[name=key]", key)
            await p.click("#login button")
            if ok:
                await p.wait_for_url(f"**/ui/jobs/{job}")
                assert await p.is_visible("#payload")
            else:
                assert "invalid API key" in await p.inner_text("#login-error")

        await login("cvk_0123456789ab_" + "A" * 43, ok=False)
        await login(keys["admin"])
        cookie = next(c for c in await p.context.cookies() if c["name"] == "conveyor_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
        assert keys["admin"] not in cookie["value"]
        assert XSS in await p.inner_text("#payload")
        assert await p.evaluate("window.pwned === undefined")
        assert "/srv/secret/handlers.py" in await p.inner_text("#fields")  # admin: everything

        # a forged token is refused; the page's own token cancels
        await p.evaluate("document.querySelector('input[name=csrf]').value = 'forged'")
        await p.click("button:has-text('Cancel')")
        assert "CSRF" in await p.inner_text("#refused")
        assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", uuid.UUID(job)) == (
            "PENDING"
        )
        await p.goto(f"{base}/ui/jobs/{job}")
        await p.click("button:has-text('Cancel')")
        await p.wait_for_url(f"**/ui/jobs/{job}")
        assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", uuid.UUID(job)) == (
            "CANCELLED"
        )

        # log out; a jobs:read key sees the job without actions and without the traceback
        await p.click("button:has-text('Log out')")
        await login(keys["jobs:read"])
        fields = await p.inner_text("#fields")
        assert "ValueError: bad input" in fields and "/srv/secret" not in fields
        assert not await p.is_visible("button:has-text('Retry')")
        response = await p.goto(f"{base}/ui/dead")
        assert response.status == 403
