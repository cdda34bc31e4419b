"""The dashboard's schedules page (``/ui/schedules``): every schedule with its rule, time zone,
next and last tick, the last job it enqueued and whether it is paused; with ``admin``, pause,
resume and delete as CSRF-protected form POSTs (the auth layer checks the token, as for every
dashboard POST) answered by a redirect. Reads go through the same store calls as
``GET /schedules`` (``schedule_list``: the primary key's order, one row per schedule)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from ...store.schedules import ScheduleRow
from ..attempts import HasConnection
from ..auth import ADMIN
from ..schedules import Name, set_enabled
from . import render as r
from .session import allows, csrf_token, page, same_origin

PAYLOAD_CHARS = 120  # the table shows the start of a payload; GET /schedules/{name} has it all


def _rule(s: ScheduleRow) -> str:
    return s.cron if s.cron is not None else f"every {s.every_seconds:g} s"


def schedules_table(rows: list[ScheduleRow], *, csrf: str, admin: bool) -> str:
    if not rows:
        return (
            '<p id="schedules-empty">No schedules: <code>POST /schedules</code>, <code>conveyor '
            "schedules add</code>, or a handler's <code>schedule=</code>/<code>every=</code>.</p>"
        )
    headers = [
        "name",
        "type",
        "rule",
        "time zone",
        "state",
        "next tick",
        "last tick",
        "last job",
        "source",
        "payload",
    ]
    if admin:
        headers.append("actions")
    out = []
    for s in rows:
        payload = orjson.dumps(s.payload).decode()
        if len(payload) > PAYLOAD_CHARS:
            payload = payload[:PAYLOAD_CHARS] + "…"
        cells = [
            r.e(s.name),
            r.link("/ui/jobs", s.job_type, type=s.job_type),
            r.e(_rule(s)),
            r.e(s.timezone),
            r.e("active" if s.enabled else "paused"),
            r.e(r.when(s.next_run_at) if s.enabled else "—"),
            r.e(r.when(s.last_tick_at)),
            r.link(f"/ui/jobs/{s.last_job_id}", s.last_job_id) if s.last_job_id else "—",
            r.e(s.source),
            f"<code>{r.e(payload)}</code>",
        ]
        if admin:
            toggle = "resume" if not s.enabled else "pause"
            cells.append(
                r.button(f"/ui/schedules/{s.name}/{toggle}", toggle.capitalize(), csrf=csrf)
                + " "
                + r.button(f"/ui/schedules/{s.name}/delete", "Delete", csrf=csrf, confirm="yes")
            )
        out.append(cells)
    return r.table(headers, out, id_="schedules")


def add_schedules_page(app: FastAPI, api: HasConnection) -> None:
    @app.get("/ui/schedules", include_in_schema=False)
    async def ui_schedules(request: Request, done: str | None = None) -> Response:
        async with api.connection() as conn:
            rows = await api.store.schedule_list(conn)
        note = f'<p class="notice" id="done">{r.e(done)}</p>' if done else ""
        body = note + schedules_table(rows, csrf=csrf_token(request), admin=allows(ADMIN))
        body += (
            '<p class="muted">Each tick enqueues exactly one job, however many sweepers run. A '
            "handler's schedule that is deleted here comes back at the next worker start unless "
            f"its <code>schedule=</code> is removed. As of {r.e(r.when(datetime.now(UTC)))}.</p>"
        )
        return page(request, "Schedules", body)

    def action_route(action: str) -> Any:
        async def act(name: Name, request: Request) -> Response:
            if not same_origin(request):
                return page(request, "Refused", "<p>Refused.</p>", 403)
            async with api.connection() as conn:
                row = await api.store.schedule_get(conn, name)
                if row is None:
                    return page(request, "Not found", f"<p>No schedule {r.e(name)}.</p>", 404)
                if action == "delete":
                    await api.store.schedule_delete(conn, name)
                else:
                    await set_enabled(api, conn, row, action == "resume")
            done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}[action]
            return RedirectResponse(f"/ui/schedules?done={name}+{done}", status_code=303)

        return act

    for action in ("pause", "resume", "delete"):
        app.post(f"/ui/schedules/{{name}}/{action}", include_in_schema=False)(action_route(action))
