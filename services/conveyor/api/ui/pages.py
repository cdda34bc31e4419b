"""The dashboard's routes: overview (live), jobs (filters, keyset pages), one job (cancel,
retry), dead letters (bulk redrive and purge by type and error, after a confirmation page).
Actions are HTML form POSTs answered by a redirect; a POST from another origin, or without the
page's CSRF token, is refused. Who may see and do what: ``api/auth.py``'s table; login, CSRF
and the security headers: ``session.py``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from ...core.jobs import Status
from ..attempts import HasConnection
from ..auth import ADMIN, WRITE, full_errors
from . import render as r
from .session import add_login_routes, allows, csrf_token, form, html, page, same_origin

STATIC = Path(__file__).parent / "static"
PAGE = 50
BULK_LIMIT = 10_000


def uuid7_floor(t: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of instant ``t``: a creation-time bound on the ``id`` index. An
    instant before 1970 (no UUIDv7 is older) is the smallest id."""
    return uuid.UUID(int=max(0, int(t.timestamp() * 1000)) << 80)


def _nul(*values: str | None) -> None:
    """PostgreSQL text cannot hold NUL: a filter with one is a bad filter, not a 500."""
    if any(v is not None and "\x00" in v for v in values):
        raise ValueError("a filter cannot contain a NUL character")


def add_ui(app: FastAPI, api: HasConnection) -> None:
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        # a PNG: every browser takes one at this path, and it spares an .ico encoder
        return FileResponse(
            STATIC / "favicon.png",
            media_type="image/png",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        # the address `conveyor dev` prints: a browser opening it wants the dashboard
        return RedirectResponse("/ui", status_code=307)

    add_login_routes(app)

    async def overview_fragment() -> str:
        async with api.connection() as conn:
            backlog = await api.store.job_backlog(conn)
            hour = await api.store.job_overview_hour(conn)
        counts: dict[str, dict[str, tuple[int, datetime]]] = {}
        for b in backlog:
            counts.setdefault(b.job_type, {})[b.status] = (b.count, b.oldest)
        return r.overview_table(counts, {h["type"]: h for h in hour}, datetime.now(UTC))

    @app.get("/ui", include_in_schema=False)
    async def ui_overview(request: Request) -> Response:
        body = (
            f'<div id="live" data-refresh="/ui/fragment/overview">{await overview_fragment()}'
            '</div><p class="muted">Counts of finished jobs and waits cover the last hour; '
            "refreshed every 5 s.</p>"
        )
        return page(request, "Overview", body)

    @app.get("/ui/fragment/overview", include_in_schema=False)
    async def ui_overview_fragment(request: Request) -> Response:
        return html(request, await overview_fragment())

    @app.get("/ui/jobs", include_in_schema=False)
    async def ui_jobs(
        request: Request,
        type: str | None = None,
        status: str | None = None,
        since: str | None = None,
        before: str | None = None,
        id: str | None = None,
    ) -> Response:
        if id:
            try:
                return RedirectResponse(f"/ui/jobs/{uuid.UUID(id.strip())}", status_code=303)
            except ValueError:
                return page(request, "Jobs", f'<p class="notice">Not a job id: {r.e(id)}</p>', 400)
        try:
            _nul(type)
            st = Status(status.upper()).value if status else None
            cursor = uuid.UUID(before) if before else None
            floor = datetime.fromisoformat(since).replace(tzinfo=UTC) if since else None
        except ValueError as exc:
            return page(request, "Jobs", f'<p class="notice">Bad filter: {r.e(exc)}</p>', 400)
        async with api.connection() as conn:
            rows = await api.store.job_page(
                conn,
                job_type=type or None,
                status=st,
                before=cursor,
                since=uuid7_floor(floor) if floor else None,
                limit=PAGE + 1,
            )
        more, rows = len(rows) > PAGE, rows[:PAGE]
        options = "".join(
            f'<option value="{s.value}"{" selected" if s.value == st else ""}>{s.value}</option>'
            for s in Status
        )
        filters = (
            '<form class="filters" method="get" action="/ui/jobs">'
            f'<input name="type" placeholder="type" value="{r.e(type)}">'
            f'<select name="status"><option value="">any status</option>{options}</select>'
            "<label>created since (UTC) "
            f'<input type="datetime-local" name="since" value="{r.e(since)}">'
            '</label> <button type="submit">Filter</button></form>'
            '<form class="filters" method="get" action="/ui/jobs">'
            '<input name="id" placeholder="find by id" size="40"> <button>Find</button></form>'
        )
        nxt = (
            r.link("/ui/jobs", "Older →", type=type, status=st, since=since, before=rows[-1].id)
            if more and rows
            else ""
        )
        body = filters + (r.jobs_table(rows) if rows else "<p>No jobs match.</p>") + nxt
        return page(request, "Jobs", body)

    @app.get("/ui/jobs/{job_id:uuid}", include_in_schema=False)
    async def ui_job(job_id: uuid.UUID, request: Request) -> Response:
        async with api.connection() as conn:
            row = await api.store.job_get(conn, job_id)
            attempts = await api.store.job_attempt_list(conn, job_id) or []
        if row is None:
            return page(request, "Job not found", f"<p>No job {r.e(job_id)}.</p>", 404)
        detail = r.job_detail(
            row,
            attempts,
            csrf=csrf_token(request),
            full_errors=full_errors(api.settings),
            can_cancel=allows(WRITE),
            can_retry=allows(ADMIN),
        )
        return page(request, f"Job {job_id}", detail)

    def job_action(action: str) -> Any:
        async def act(job_id: uuid.UUID, request: Request) -> Response:
            if not same_origin(request):
                return page(request, "Refused", "<p>Refused.</p>", 403)
            async with api.connection() as conn, conn.transaction():
                if action == "cancel":
                    await api.store.job_cancel(conn, job_id)
                else:
                    await api.store.job_redrive(conn, [job_id])
                    await api.store.outbox_notify(conn)
            return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)

        return act

    for action in ("cancel", "retry"):
        app.post(f"/ui/jobs/{{job_id:uuid}}/{action}", include_in_schema=False)(job_action(action))

    @app.get("/ui/dead", include_in_schema=False)
    async def ui_dead(request: Request, done: str | None = None) -> Response:
        async with api.connection() as conn:
            groups = await api.store.job_dead_groups(conn)
        rows = [
            [
                r.link("/ui/jobs", g["type"], type=g["type"], status="FAILED"),
                f"<pre>{r.e(g['error'])}</pre>",
                r.e(g["count"]),
                r.e(r.when(g["last_failed"])),
                r.link(
                    "/ui/dead/confirm",
                    "Redrive…",
                    action="redrive",
                    type=g["type"],
                    error=g["error"],
                )
                + " "
                + r.link(
                    "/ui/dead/confirm", "Purge…", action="purge", type=g["type"], error=g["error"]
                ),
            ]
            for g in groups
        ]
        notice = f'<p class="notice" id="done">{r.e(done)}</p>' if done else ""
        body = notice + (
            r.table(["type", "error", "jobs", "last failed", ""], rows, id_="dead")
            if rows
            else "<p>No dead letters.</p>"
        )
        return page(request, "Dead letters (FAILED jobs)", body)

    @app.get("/ui/dead/confirm", include_in_schema=False)
    async def ui_dead_confirm(
        request: Request, action: str, type: str, error: str | None = None
    ) -> Response:
        if action not in ("redrive", "purge"):
            return page(request, "Dead letters", "<p>Unknown action.</p>", 400)
        try:
            _nul(type, error)
        except ValueError as exc:
            return page(request, "Dead letters", f'<p class="notice">{r.e(exc)}</p>', 400)
        async with api.connection() as conn:
            n = await api.store.job_dead_count(conn, type, error)
        what = "back to PENDING with fresh retries" if action == "redrive" else "deleted for good"
        body = (
            f'<p id="confirm-text">{r.e(n)} FAILED job(s) of type <b>{r.e(type)}</b> with '
            f"error <code>{r.e(error)}</code> will be {what}.</p>"
            + r.button(
                f"/ui/dead/{action}",
                f"Yes, {action} {n} job(s)",
                csrf=csrf_token(request),
                type=type,
                error=error or "",
                confirm="yes",
            )
            + r.link("/ui/dead", "Cancel")
        )
        return page(request, f"Confirm {action}", body)

    def dead_action(action: str) -> Any:
        async def act(request: Request) -> Response:
            fields = await form(request)
            if not same_origin(request) or fields.get("confirm") != "yes" or not fields.get("type"):
                return page(request, "Refused", "<p>Refused: confirm the action first.</p>", 403)
            job_type, error = fields["type"], fields.get("error") or None
            try:
                _nul(job_type, error)
            except ValueError as exc:
                return page(request, "Dead letters", f'<p class="notice">{r.e(exc)}</p>', 400)
            async with api.connection() as conn, conn.transaction():
                if action == "redrive":
                    n = await api.store.job_redrive_dead(conn, job_type, error, limit=BULK_LIMIT)
                    await api.store.outbox_notify(conn)
                else:
                    n = await api.store.job_purge_dead(conn, job_type, error, limit=BULK_LIMIT)
            done = f"{action}: {n} job(s)"
            return RedirectResponse("/ui/dead?" + urlencode({"done": done}), status_code=303)

        return act

    for action in ("redrive", "purge"):
        app.post(f"/ui/dead/{action}", include_in_schema=False)(dead_action(action))
