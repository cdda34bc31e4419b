"""``/docs`` from packaged assets: Swagger UI's files (``swagger_ui/``, swagger-ui-dist vendored
with its licence, version in ``swagger_ui/VERSION.md``) are served by the API itself, so the page
works on a machine without internet. It renders OpenAPI 3.1, which FastAPI writes. ``/redoc`` is
off (``app.py``): its page loads fonts from the internet."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"
SWAGGER_UI = Path(__file__).parent / "swagger_ui"


def install_docs(app: FastAPI) -> None:
    """Replace FastAPI's CDN-backed ``/docs`` with one served from the package."""
    app.router.routes[:] = [
        route for route in app.router.routes if getattr(route, "path", None) != "/docs"
    ]
    app.mount(ASSETS, StaticFiles(directory=SWAGGER_UI), "docs")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return _with_csp(
            get_swagger_ui_html(
                openapi_url=app.openapi_url or "/openapi.json",
                title=f"{app.title} · API docs",
                swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                swagger_css_url=f"{ASSETS}/swagger-ui.css",
                swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
                # no badge from validator.swagger.io: nothing leaves this origin
                swagger_ui_parameters={"validatorUrl": None},
            )
        )


def _with_csp(page: HTMLResponse) -> HTMLResponse:
    """A strict CSP: scripts from this origin plus the page's one inline script, by its hash."""
    body = bytes(page.body)
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(m.group(1)).digest()).decode() + "'"
        for m in re.finditer(rb"<script>(.*?)</script>", body, re.S)
    )
    page.headers["Content-Security-Policy"] = (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    page.headers["X-Content-Type-Options"] = "nosniff"
    return page
