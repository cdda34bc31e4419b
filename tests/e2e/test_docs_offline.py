"""/docs loads Swagger UI from the API itself (the package's files), never from a CDN."""

from __future__ import annotations

import re

from conveyor.core.config import Settings

from ..stack import running_stack


async def test_docs_page_uses_only_local_assets(settings: Settings) -> None:
    async with running_stack(settings, None, maintenance=False) as stack:
        page = await stack.client.get("/docs")
        assert page.status_code == 200
        urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert urls and all(u.startswith("/") for u in urls), urls
        for url in urls:
            r = await stack.client.get(url)
            assert r.status_code == 200 and len(r.content) > 100, url
        assert "/openapi.json" in page.text
        ui = await stack.client.get("/ui")
        assert ui.status_code == 200 and "https://" not in ui.text
