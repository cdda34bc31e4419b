"""The access log: one line per request with the method, the route's path template (never the
raw path, the query string, a header or the body, so no id, key or payload leaks into logs),
the status and the duration."""

from __future__ import annotations

import logging
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.logging import event

log = logging.getLogger("conveyor.access")
_CONVERTER = re.compile(r"\{(\w+):\w+\}")
_PATHS: dict[str, str] = {}  # route template → the logged path


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            template = getattr(scope.get("route"), "path", None) or "<unmatched>"
            path = _PATHS.get(template)
            if path is None:  # once per route: the app's routes bound the cache
                # "/jobs/{job_id:uuid}" → "/jobs/{job_id}", the path as OpenAPI names it
                path = _PATHS[template] = _CONVERTER.sub(r"{\1}", template)
            event(
                log,
                "http_request",
                method=scope["method"],
                path=path,
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 2),
            )
