"""``/docs`` in a real browser (Debian's Chromium driven by Playwright): Swagger UI renders every
operation ``/openapi.json`` declares (OpenAPI 3.1), and the page fetches nothing from anywhere but
the API itself. ``/redoc`` (whose page loads fonts from the internet) is off."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from conveyor.core.config import Settings

from ..security import required
from ..stack import running_stack
from .test_dashboard import CHROMIUM, FLAGS

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}

pytestmark = pytest.mark.timeout(120)


async def test_docs_render_every_operation_offline(settings: Settings) -> None:
    playwright = pytest.importorskip("playwright.async_api")
    if not shutil.which(CHROMIUM):
        pytest.fail("chromium missing: apt-get install chromium chromium-driver (make install)")
    async with running_stack(settings, None, maintenance=False) as stack:
        base = str(stack.client.base_url).rstrip("/")
        spec = (await stack.client.get("/openapi.json")).json()
        assert spec["openapi"].startswith("3.1")
        operations = sum(len(METHODS & item.keys()) for item in spec["paths"].values())
        assert operations >= 20, operations
        assert (await stack.client.get("/redoc")).status_code == 404

        async with playwright.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page: Any = await browser.new_page(viewport={"width": 1280, "height": 800})
                requested: list[str] = []
                errors: list[str] = []
                page.on("request", lambda request: requested.append(request.url))
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on(
                    "console",
                    lambda msg: errors.append(msg.text) if msg.type == "error" else None,
                )
                await page.goto(f"{base}/docs")
                await page.wait_for_function(
                    "n => document.querySelectorAll('.opblock').length >= n",
                    arg=operations,
                    timeout=30_000,
                )
                shown = await page.locator(".opblock").count()
                text = await page.inner_text("body")
            finally:
                await browser.close()
    assert shown == operations, (shown, operations)
    assert "Unable to render this definition" not in text
    assert not errors, errors
    assert requested and all(url.startswith(base + "/") for url in requested), requested


async def test_the_bare_address_opens_the_dashboard(settings: Settings) -> None:
    """``conveyor dev`` prints ``API http://127.0.0.1:<port>``: opened in a browser, that address
    lands on the dashboard, not on a 404 (it answered ``{"detail": "Not Found"}``). With keys
    required it leads to the dashboard's login form, and it is not an operation of the API."""
    playwright = pytest.importorskip("playwright.async_api")
    if not shutil.which(CHROMIUM):
        pytest.fail("chromium missing: apt-get install chromium chromium-driver (make install)")
    async with running_stack(settings, None, maintenance=False) as stack:
        base = str(stack.client.base_url).rstrip("/")
        assert "/" not in (await stack.client.get("/openapi.json")).json()["paths"]
        async with playwright.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page: Any = await browser.new_page()
                answer = await page.goto(base)
                landed, title = page.url, await page.title()
            finally:
                await browser.close()
    assert answer.status == 200 and landed == f"{base}/ui", (answer.status, landed)
    assert title.startswith("Overview"), title
    async with running_stack(required(settings), None, maintenance=False) as stack:
        first = await stack.client.get("/", follow_redirects=False)
        assert first.status_code == 307 and first.headers["location"] == "/ui"
        login = await stack.client.get("/", follow_redirects=True)
        assert login.status_code == 401 and "<form" in login.text
