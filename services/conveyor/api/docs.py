"""``/docs`` from packaged assets: Swagger UI's files come from the ``swagger-ui-bundle`` package
and are served by the API itself, so the page works on a machine without internet."""

from __future__ import annotations

from pathlib import Path

import swagger_ui_bundle
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"


def install_docs(app: FastAPI) -> None:
    """Replace FastAPI's CDN-backed ``/docs`` with one served from the package."""
    app.router.routes[:] = [
        route for route in app.router.routes if getattr(route, "path", None) != "/docs"
    ]
    app.mount(ASSETS, StaticFiles(directory=Path(swagger_ui_bundle.swagger_ui_path)), "docs")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} · API docs",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )
