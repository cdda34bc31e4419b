"""Dashboard security over HTTP (the browser test covers the login flow): CSRF tokens with auth
disabled too, security headers on every page, payload and error text escaped, tracebacks only
for admin in the API's job resource and attempt list."""

from __future__ import annotations

import asyncio
import re
import uuid

import asyncpg
import httpx

from conveyor.cli.keys import create_key, revoke_key
from conveyor.core.config import Settings

from ..security import bearer, keyed_stack, required
from ..stack import running_stack

XSS = "<script>window.pwned=1</script>"
TRACEBACK = 'Traceback (most recent call last):\n  File "/srv/app/h.py", line 3\nKeyError: x'


async def test_csrf_and_headers_with_auth_disabled(settings: Settings) -> None:
    open_types = settings.model_copy(update={"accept_unknown_types": True})
    async with running_stack(open_types, None, maintenance=False, relays=0) as stack:
        c = stack.client
        job = await stack.submit("x", {"note": XSS})
        page = await c.get(f"/ui/jobs/{job}")
        assert XSS not in page.text and "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page.text
        pages = ("/ui", "/ui/jobs", f"/ui/jobs/{job}", "/ui/dead", "/ui/types", "/ui/schedules")
        for path in (*pages, "/ui/fragment/overview"):
            r = await c.get(path)
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp, path
            assert "frame-ancestors 'none'" in csp and r.headers["x-content-type-options"]
            assert "<script>" not in r.text  # no inline script: only <script src=...>
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        url = f"/ui/jobs/{job}/cancel"
        form = {"content-type": "application/x-www-form-urlencoded"}
        # no token, a wrong token, a token without its cookie: refused, job untouched
        assert (await c.post(url, content="go=1", headers=form)).status_code == 403
        assert (await c.post(url, content="csrf=nope", headers=form)).status_code == 403
        async with httpx.AsyncClient(base_url=c.base_url) as other:  # another browser: no cookie
            r = await other.post(url, content=f"csrf={token.group(1)}", headers=form)
            assert r.status_code == 403
        r = await c.get(f"/jobs/{job}")
        assert r.json()["status"] == "PENDING"
        r = await c.post(url, content=f"csrf={token.group(1)}", headers=form)
        assert r.status_code == 303
        assert (await c.get(f"/jobs/{job}")).json()["status"] == "CANCELLED"


async def test_tracebacks_only_for_admin(settings: Settings, db: asyncpg.Connection) -> None:
    async with keyed_stack(settings) as (stack, keys):
        c = stack.client
        r = await c.post("/jobs", json={"type": "x"}, headers=bearer(keys["jobs:write"]))
        job = r.json()["id"]
        await db.execute("UPDATE jobs SET last_error = $2, attempts = 1 WHERE id = $1",
                         uuid.UUID(job), TRACEBACK)  # fmt: skip
        await db.execute(
            "INSERT INTO job_attempts (job_id, attempt, job_type, finished_at, outcome, error) "
            "VALUES ($1, 1, 'x', now(), 'retry', $2)", uuid.UUID(job), TRACEBACK,
        )  # fmt: skip
        for key, full in ((keys["jobs:read"], False), (keys["admin"], True)):
            body = (await c.get(f"/jobs/{job}", headers=bearer(key))).json()
            assert body["last_error"] == "KeyError: x"
            assert body["last_error_traceback"] == (TRACEBACK if full else None)
            attempts = (await c.get(f"/jobs/{job}/attempts", headers=bearer(key))).json()
            assert attempts["attempts"][0]["error"] == (TRACEBACK if full else "KeyError: x")
            page = (await c.get(f"/ui/jobs/{job}", headers=bearer(key))).text
            assert ("/srv/app/h.py" in page) is full


async def test_session_cookie_secure_behind_tls_no_open_redirect_and_revocation(
    settings: Settings,
) -> None:
    async with keyed_stack(settings) as (stack, _):
        c = stack.client
        key = await create_key(required(settings), "browser", "jobs:read")
        form = {"content-type": "application/x-www-form-urlencoded"}
        r = await c.post("/ui/login", content=f"key={key}&next=//evil.example/x",
                         headers={**form, "x-forwarded-proto": "https"})  # fmt: skip
        assert r.status_code == 303 and r.headers["location"] == "/ui"
        cookie = r.headers["set-cookie"]
        assert all(a in cookie for a in ("HttpOnly", "SameSite=strict", "Secure", "Path=/ui"))
        assert key.split("_", 2)[2] not in cookie
        r = await c.post("/ui/login", content=f"key={key}&next=/ui/jobs", headers=form)
        assert r.headers["location"] == "/ui/jobs" and "Secure" not in r.headers["set-cookie"]
        session = r.cookies["conveyor_session"]
        c.cookies.clear()

        async def status(path: str, value: str) -> int:
            async with httpx.AsyncClient(
                base_url=c.base_url, cookies={"conveyor_session": value}
            ) as b:
                return (await b.get(path)).status_code

        assert await status("/ui", session) == 200
        assert await status("/jobs", session) == 401  # the cookie is for the dashboard only
        forged = session[:-1] + ("0" if session[-1] != "0" else "1")
        assert await status("/ui", forged) == 401
        r = await c.post("/ui/login", content="key=cvk_nope", headers=form)
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert await revoke_key(required(settings), "browser") == 1
        for _ in range(60):  # the session ends with its key, within the cache's 2 s
            if await status("/ui", session) == 401:
                break
            await asyncio.sleep(0.1)
        assert await status("/ui", session) == 401
