"""``/docs`` in a real browser (Debian's Chromium driven by Playwright): Swagger UI renders every
operation ``/openapi.json`` declares (OpenAPI 3.1), and the page fetches nothing from anywhere but
the API itself. ``/redoc`` (whose page loads fonts from the internet) is off."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from conveyor.core.config import Settings

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
