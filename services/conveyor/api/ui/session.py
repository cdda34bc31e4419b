"""The dashboard's login, session cookie, CSRF tokens, security headers and page frame.

- Login: ``/ui/login`` takes a key once and sets ``conveyor_session`` = ``<key id>.<expiry>.<mac>``
  with mac = HMAC-SHA256(the key's stored hash, id and expiry): every replica can check it
  through its key cache (no shared secret, no session table), and revoking the key ends its
  sessions. Cookie: ``HttpOnly``, ``SameSite=Strict``, ``Path=/ui``, ``Secure`` when the request
  came over https (or ``X-Forwarded-Proto: https``).
- CSRF: every form POST carries ``csrf``: HMAC(the key's hash, the session cookie) when logged
  in; with auth disabled, the value of a random ``conveyor_csrf`` cookie (double submit).
  A request authenticated by an ``Authorization`` header carries no ambient credential and needs
  none. ``auth.Auth`` checks the cookie and the token before the route runs.
- Every page: a strict Content-Security-Policy (scripts and styles from ``/ui/static`` only, no
  inline script), ``nosniff``, ``frame-ancestors 'none'``, same-origin referrers, ``no-store``."""

from __future__ import annotations

import secrets
import time
from urllib.parse import parse_qs, urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ..auth import CSRF, CURRENT, SESSION, SESSION_SECONDS, Auth, AuthError, session_cookie
from . import render as r

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # not no-referrer: Chromium then sends "Origin: null" on form POSTs (refused as cross-site)
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _https(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"


def _cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=_https(request),
    )


def csrf_token(request: Request) -> str:
    """The token forms of this page carry."""
    p = CURRENT.get()
    if p is not None and (session := p.session_csrf()):
        return session
    token = request.cookies.get(CSRF) or getattr(request.state, "new_csrf", None)
    if not token:
        token = request.state.new_csrf = secrets.token_urlsafe(24)
    return str(token)


def html(request: Request, body: str, status: int = 200) -> HTMLResponse:
    """A dashboard page with the security headers (and the CSRF cookie it introduced)."""
    response = HTMLResponse(body, status_code=status, headers=HEADERS)
    new = getattr(request.state, "new_csrf", None)
    if new:
        _cookie(response, request, CSRF, new, SESSION_SECONDS)
    return response


def page(request: Request, title: str, body: str, status: int = 200) -> Response:
    """A page in the dashboard's frame, naming the logged-in key."""
    p = CURRENT.get()
    user = p.name if p is not None and p.via == "session" else ""
    return html(request, r.page(title, body, user=user), status)


def error_page(request: Request, status: int, message: str) -> Response:
    """An error under ``/ui`` (an unknown page, a malformed id, a database down) as a page."""
    title = {404: "Not found", 503: "Unavailable"}.get(status, "Error")
    body = f'<p class="notice" id="error">{r.e(message)}</p><p>{r.link("/ui", "Overview")}</p>'
    return page(request, title, body, status)


def allows(scope: str) -> bool:
    """May the current caller use ``scope`` (everyone may with auth disabled)?"""
    p = CURRENT.get()
    return p is None or p.allows(scope)


def same_origin(request: Request) -> bool:
    """CSRF: browsers send Origin (and Sec-Fetch-Site) on form POSTs; refuse another site's."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")


async def form(request: Request) -> dict[str, str]:
    """A form POST's fields (the first value of each)."""
    data = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    # browsers submit a field's newlines as CRLF: an error text from a traceback has LF
    return {k: v[0].replace("\r\n", "\n") for k, v in data.items()}


def _login_form(request: Request, message: str = "") -> str:
    nxt = request.query_params.get("next") or (
        request.url.path if request.method == "GET" and request.url.path != "/ui/login" else "/ui"
    )
    notice = f'<p class="notice" id="login-error">{r.e(message)}</p>' if message else ""
    return r.page(
        "Log in",
        notice
        + (
            '<form method="post" action="/ui/login" id="login">'
            f'<input type="hidden" name="next" value="{r.e(_safe_next(nxt))}">'
            '<label>API key <input type="password" name="key" size="70" autocomplete="off" '
            'required></label> <button type="submit">Log in</button></form>'
            '<p class="muted">Any key works; pages and actions follow its scopes.</p>'
        ),
    )


def refused_page(request: Request, exc: AuthError) -> Response:
    if exc.status == 401:
        body = _login_form(request, "" if request.url.path == "/ui" else exc.detail)
    else:
        body = r.page("Refused", f'<p class="notice" id="refused">{r.e(exc.detail)}</p>')
    response = html(request, body, exc.status)
    response.headers.update(exc.headers)
    return response


def _safe_next(value: str) -> str:
    """Only a dashboard path (no open redirect)."""
    ok = value.startswith("/ui") and not value.startswith("//") and "\\" not in value
    return value if ok else "/ui"


def add_login_routes(app: FastAPI) -> None:
    @app.get("/ui/login", include_in_schema=False)
    async def ui_login(request: Request) -> Response:
        if app.state.auth.settings.auth != "required":
            return RedirectResponse("/ui", status_code=303)
        return html(request, _login_form(request))

    @app.post("/ui/login", include_in_schema=False)
    async def ui_login_post(request: Request) -> Response:
        fields = await form(request)
        auth: Auth = app.state.auth
        if not same_origin(request):
            return html(request, r.page("Refused", "<p>Refused.</p>"), 403)
        row = await auth.keys.verify(fields.get("key", "").strip())
        if row is None:
            return html(request, _login_form(request, "invalid API key"), 401)
        expiry = str(int(time.time()) + SESSION_SECONDS)
        value = session_cookie(row.key_id, row.key_hash, expiry)
        response = RedirectResponse(_safe_next(fields.get("next", "/ui")), status_code=303)
        _cookie(response, request, SESSION, value, SESSION_SECONDS)
        return response

    @app.post("/ui/logout", include_in_schema=False)
    async def ui_logout(request: Request) -> Response:
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(SESSION, path="/ui", httponly=True, samesite="strict")
        return response
