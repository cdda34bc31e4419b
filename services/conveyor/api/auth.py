"""Who may call what (docs/security.md). ``ROUTE_SCOPES`` is the one table from
(method, path template) to the scope a route needs, or ``OPEN``; ``Auth`` enforces it on every
route, the dashboard's included. A route missing from the table needs ``admin`` (fail closed)
and ``tests/unit/test_route_scopes.py`` fails until it is declared: add new routes here.
``Auth`` runs as the first step of every route's handler (a route class that ``install`` puts on
the app's router), not as a FastAPI dependency: the dependency solver cost ~9 % of the API's CPU
per submit, with auth disabled too.

Credentials: ``Authorization: Bearer <key>`` only (never a query string); the dashboard also
accepts its session cookie on ``/ui`` paths, checked here with its CSRF token (``ui/session.py``
logs in and sets both). 401 (with ``WWW-Authenticate:
Bearer``) for a missing or bad key, 403 for a missing scope, 429 (``Retry-After``) over the
submit quota. Keys are never logged: the access log writes no header."""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from ..core.apikeys import SCOPES, effective
from ..core.config import Settings
from .errors import error_response
from .keycache import KeyCache
from .ratelimit import FleetRateLimiter

OPEN = "open"
READ, WRITE, ADMIN = SCOPES

ROUTE_SCOPES: dict[tuple[str, str], str] = {
    # probes and documents
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/openapi.json"): OPEN,
    ("GET", "/docs"): OPEN,
    ("GET", "/docs/oauth2-redirect"): OPEN,
    ("GET", "/metrics"): OPEN,  # READ under CONVEYOR_METRICS_AUTH=required
    ("GET", "/favicon.ico"): OPEN,
    ("GET", "/"): OPEN,  # a redirect to /ui, which asks for a key itself
    # jobs
    ("POST", "/jobs"): WRITE,
    ("POST", "/jobs/batch"): WRITE,
    ("GET", "/jobs"): READ,
    ("GET", "/jobs/{job_id}"): READ,
    ("GET", "/jobs/{job_id}/attempts"): READ,
    ("POST", "/jobs/{job_id}/cancel"): WRITE,
    ("POST", "/jobs/{job_id}/retry"): ADMIN,
    # job types: reading is jobs:read, changing pause/limits (of the type, of a key) is admin
    ("GET", "/types"): READ,
    ("POST", "/types/{name}/pause"): ADMIN,
    ("POST", "/types/{name}/resume"): ADMIN,
    ("PUT", "/types/{name}/limits"): ADMIN,
    ("GET", "/types/{name}/partitions"): READ,
    ("PUT", "/types/{name}/partitions/{key}"): ADMIN,
    # schedules: reading is jobs:read, every change is admin
    ("GET", "/schedules"): READ,
    ("GET", "/schedules/{name}"): READ,
    ("POST", "/schedules"): ADMIN,
    ("DELETE", "/schedules/{name}"): ADMIN,
    ("POST", "/schedules/{name}/pause"): ADMIN,
    ("POST", "/schedules/{name}/resume"): ADMIN,
    # workflows: as jobs
    ("POST", "/workflows"): WRITE,
    ("GET", "/workflows"): READ,
    ("GET", "/workflows/{workflow_id}"): READ,
    ("POST", "/workflows/{workflow_id}/cancel"): WRITE,
    # dashboard
    ("GET", "/ui/login"): OPEN,
    ("POST", "/ui/login"): OPEN,
    ("POST", "/ui/logout"): OPEN,
    ("GET", "/ui"): READ,
    ("GET", "/ui/fragment/overview"): READ,
    ("GET", "/ui/jobs"): READ,
    ("GET", "/ui/jobs/{job_id}"): READ,
    ("POST", "/ui/jobs/{job_id}/cancel"): WRITE,
    ("POST", "/ui/jobs/{job_id}/retry"): ADMIN,
    ("GET", "/ui/types"): READ,
    ("GET", "/ui/workflows"): READ,
    ("GET", "/ui/workflows/{workflow_id}"): READ,
    ("GET", "/ui/schedules"): READ,
    ("POST", "/ui/schedules/{name}/pause"): ADMIN,
    ("POST", "/ui/schedules/{name}/resume"): ADMIN,
    ("POST", "/ui/schedules/{name}/delete"): ADMIN,
    ("GET", "/ui/dead"): ADMIN,
    ("GET", "/ui/dead/confirm"): ADMIN,
    ("POST", "/ui/dead/redrive"): ADMIN,
    ("POST", "/ui/dead/purge"): ADMIN,
}
# mounted static files (no data): open
OPEN_MOUNTS = ("/ui/static", "/docs-assets")
# routes that count against CONVEYOR_RATE_LIMIT
SUBMITS = frozenset({("POST", "/jobs"), ("POST", "/jobs/batch"), ("POST", "/workflows")})

SESSION, CSRF = "conveyor_session", "conveyor_csrf"  # the dashboard's cookies
SESSION_SECONDS = 12 * 3600

_CONVERTER = re.compile(r"\{(\w+):\w+\}")


def template(path: str) -> str:
    """``/jobs/{job_id:uuid}`` → ``/jobs/{job_id}``, the path as OpenAPI names it."""
    return _CONVERTER.sub(r"{\1}", path)


def mac(key_hash: bytes, text: str) -> str:
    return hmac.new(key_hash, text.encode(), hashlib.sha256).hexdigest()


def session_cookie(key_id: str, key_hash: bytes, expiry: str) -> str:
    """``<key id>.<expiry>.<mac>``, mac keyed by the key's stored hash: every replica checks it
    through its key cache (no shared secret, no session table); revoking the key ends it."""
    return f"{key_id}.{expiry}.{mac(key_hash, f'session.{key_id}.{expiry}')}"


def declared_scope(method: str, path: str) -> str | None:
    """The table's entry (HEAD is GET's), or None when the route was not declared."""
    return ROUTE_SCOPES.get(("GET" if method == "HEAD" else method, template(path)))


@dataclass(frozen=True)
class Principal:
    """The caller of the current request. ``via``: bearer, session or none (auth disabled)."""

    name: str
    scopes: frozenset[str]
    full_errors: bool
    via: str = "none"
    key_id: str | None = None
    key_hash: bytes = field(default=b"", repr=False)
    session: str | None = field(default=None, repr=False)

    def allows(self, scope: str) -> bool:
        return scope == OPEN or scope in self.scopes

    def session_csrf(self) -> str | None:
        """The CSRF token of a session's forms: HMAC(the key's hash, the session cookie)."""
        if self.via == "session" and self.session:
            return mac(self.key_hash, "csrf." + self.session)[:32]
        return None


CURRENT: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "conveyor_principal", default=None
)


def full_errors(settings: Settings) -> bool:
    """May the current caller read tracebacks (server paths)? ``admin`` may; with auth disabled
    (or outside a request), ``CONVEYOR_API_EXPOSE_TRACEBACKS`` decides."""
    p = CURRENT.get()
    return settings.api_expose_tracebacks if p is None else p.full_errors


class AuthError(Exception):
    def __init__(
        self,
        status: int,
        error: str,
        detail: str,
        *,
        html: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.html = status, error, detail, html
        self.headers = headers or {}


class Auth:
    """Who may call what (``install``)."""

    def __init__(self, settings: Settings, api: Any) -> None:
        self.settings = settings
        self.required = settings.auth == "required"
        self.api = api
        self.keys = KeyCache(api, settings.auth_cache_seconds)
        self.limiter = FleetRateLimiter(settings.rate_limit, self._rate_take)
        self.anonymous = Principal("anonymous", frozenset(SCOPES), settings.api_expose_tracebacks)
        self._routes: dict[tuple[int, str], tuple[str, str]] = {}
        self.route_class: type[APIRoute] | None = None  # set by ``install``: the guarded routes

    async def _rate_take(self, who: str, rate: float, size: float, want: int) -> tuple[int, float]:
        async with self.api.connection() as conn:
            taken: tuple[int, float] = await self.api.store.api_rate_take(
                conn, who, rate, size, want
            )
        return taken

    def scope_of(self, method: str, path: str) -> str | None:
        """The scope (method, path template) needs here (None: not declared)."""
        if template(path) == "/metrics" and self.settings.metrics_auth == "required":
            return READ
        return declared_scope(method, path)

    def _route(self, request: Request) -> tuple[str, str]:
        """(scope needed, path template) of the matched route, computed once per route."""
        route = request.scope.get("route")
        k = (id(route), request.method)
        found = self._routes.get(k)
        if found is None:
            path = template(getattr(route, "path", ""))
            need = self.scope_of(request.method, path) or ADMIN  # undeclared: fail closed
            found = self._routes[k] = (need, path)
        return found

    async def __call__(self, request: Request) -> None:
        """The guarded route class's first step: the scope the table gives the route."""
        need, path = self._route(request)
        await self.check(request, need, path)

    async def foreign(self, request: Request) -> None:
        """The app-wide dependency, for a route not of the guarded class (a router included
        with ``include_router``): not in the table, so ``admin`` (fail closed)."""
        await self.check(request, ADMIN, request.url.path)

    async def check(self, request: Request, need: str, path: str) -> None:
        if need == OPEN:
            CURRENT.set(None)
            return
        ui = path.startswith("/ui")
        if self.required:
            p = await self.authenticate(request, ui)
            if not p.allows(need):
                raise AuthError(403, "forbidden", f"this key lacks the scope {need}", html=ui)
        else:
            p = self.anonymous
        if ui and request.method == "POST" and p.via != "bearer":
            await _check_csrf(request, p)
        if (request.method, path) in SUBMITS:
            wait = await self.limiter.take(p.key_id or p.name)
            if wait is not None:
                raise AuthError(
                    429,
                    "rate_limited",
                    f"over the submit quota; retry in {wait} s",
                    headers={"Retry-After": str(wait)},
                )
        CURRENT.set(p)

    async def authenticate(self, request: Request, ui: bool) -> Principal:
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, key = header.partition(" ")
            row = await self.keys.verify(key.strip()) if scheme.lower() == "bearer" else None
            if row is None:
                raise _unauthorized("invalid API key", ui, invalid=True)
            return self.principal(row, "bearer")
        if ui:
            p = await self.from_cookie(request)
            if p is not None:
                return p
        raise _unauthorized("an API key is required: Authorization: Bearer <key>", ui)

    def principal(self, row: Any, via: str, session: str | None = None) -> Principal:
        scopes = effective(row.scopes)
        full = ADMIN in scopes or self.settings.api_expose_tracebacks
        return Principal(row.name, scopes, full, via, row.key_id, row.key_hash, session)

    async def from_cookie(self, request: Request) -> Principal | None:
        value = request.cookies.get(SESSION)
        if not value or len(value) > 200:
            return None
        key_id, _, rest = value.partition(".")
        expiry, _, _ = rest.partition(".")
        if not expiry.isdigit() or int(expiry) < time.time():
            return None
        row = await self.keys.row(key_id)
        if row is None or row.revoked_at is not None:
            return None
        if not hmac.compare_digest(session_cookie(key_id, row.key_hash, expiry), value):
            return None
        return self.principal(row, "session", session=value)


async def _check_csrf(request: Request, p: Principal) -> None:
    """A dashboard POST carries ``csrf``: its session's token, or with auth disabled the value
    of the ``conveyor_csrf`` cookie (double submit). A bearer header needs none."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    sent = (form.get("csrf") or [request.headers.get("x-csrf-token", "")])[0]
    expected = p.session_csrf() or request.cookies.get(CSRF, "")
    if not sent or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise AuthError(
            403, "csrf_failed", "missing or wrong CSRF token: reload the page", html=True
        )


def _unauthorized(detail: str, ui: bool, *, invalid: bool = False) -> AuthError:
    challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return AuthError(401, "unauthorized", detail, html=ui, headers={"WWW-Authenticate": challenge})


def install(
    app: FastAPI,
    api: Any,
    settings: Settings,
    refused_page: Callable[[Request, AuthError], Response],
) -> Auth:
    """Call before any route is added: every route added afterwards runs ``Auth`` first.
    ``refused_page`` renders a refusal on a dashboard path (the login form for a 401)."""
    auth = Auth(settings, api)

    # Fail closed: a route of any other class (include_router keeps a router's own) runs
    # this dependency instead; the guarded class leaves it out and runs ``auth`` itself.
    foreign = Depends(auth.foreign)

    class GuardedRoute(APIRoute):
        """Every API route added after ``install``: ``auth`` first (before the route's own
        parameters are read, so 401/403 come before 422), then the route."""

        def __init__(self, path: str, endpoint: Callable[..., Any], **kw: Any) -> None:
            kw["dependencies"] = [d for d in kw.get("dependencies") or () if d is not foreign]
            super().__init__(path, endpoint, **kw)

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                await auth(request)
                return await handler(request)

            return guarded

    app.router.route_class = auth.route_class = GuardedRoute
    app.router.dependencies.append(foreign)
    app.state.auth = auth

    @app.exception_handler(AuthError)
    async def _refused(request: Request, exc: AuthError) -> Response:
        api.metrics.api_errors.labels(str(exc.status)).inc()
        if exc.html:
            return refused_page(request, exc)
        return error_response(exc.status, exc.error, exc.detail, exc.headers)

    return auth
