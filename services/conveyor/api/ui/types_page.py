"""The dashboard's job-types page (``/ui/types``): every registered type with its handler's
defaults and limits, as ``GET /types`` reports them, beside its jobs waiting, running and
failed. Rendered with ``render`` (every value escaped by ``e``), read-only: no form, no action."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..attempts import HasConnection
from ..types_routes import type_dict
from . import render as r
from .session import page

COUNTED = ("WAITING", "PENDING", "SCHEDULED", "RETRYING", "IN_PROGRESS", "FAILED")
# the limits a type may carry (job features: fleet-wide concurrency, rate limit, pause); shown
# when the type's data has them
LIMITS = (("concurrency", "concurrency"), ("rate_limit", "rate limit"), ("paused", "paused"))


def _delays(value: Any) -> str:
    return ", ".join(f"{d} s" for d in value) if value else "backoff"


def types_table(types: list[dict[str, Any]], counts: dict[str, dict[str, int]]) -> str:
    limits = [(k, label) for k, label in LIMITS if any(k in t for t in types)]
    headers = ["type", "max retries", "timeout", "retry delays", *(lbl for _, lbl in limits)]
    headers += [s.lower().replace("_", " ") for s in COUNTED] + ["registered", "last seen"]
    rows = []
    for t in types:
        name, by_status = t["name"], counts.get(t["name"], {})
        timeout = t.get("timeout_seconds")
        cells = [
            r.link("/ui/jobs", name, type=name),
            r.e("default" if t.get("max_retries") is None else t["max_retries"]),
            r.e("none" if timeout is None else f"{timeout:g} s"),
            r.e(_delays(t.get("retry_delays"))),
        ]
        for key, _ in limits:
            value = t.get(key)
            cells.append(r.e("yes" if value is True else "—" if value in (None, False) else value))
        cells += [
            r.link("/ui/jobs", by_status[s], type=name, status=s) if by_status.get(s) else "0"
            for s in COUNTED
        ]
        cells += [r.e(r.when(t.get("first_seen"))), r.e(r.when(t.get("last_seen")))]
        rows.append(cells)
    if not rows:
        return (
            '<p id="types-empty">No job types yet: a worker registers its types when it starts '
            "(or <code>conveyor types register --app MODULE:ATTR</code>).</p>"
        )
    return r.table(headers, rows, id_="types")


def add_types_page(app: FastAPI, api: HasConnection) -> None:
    @app.get("/ui/types", include_in_schema=False)
    async def ui_types(request: Request) -> Response:
        async with api.connection() as conn:
            types = [type_dict(t) for t in await api.store.job_type_list(conn)]
            backlog = await api.store.job_backlog(conn)
        counts: dict[str, dict[str, int]] = {}
        for b in backlog:
            counts.setdefault(b.job_type, {})[b.status] = b.count
        now = datetime.now(UTC)
        body = types_table(types, counts) + (
            '<p class="muted">Defaults come from the handlers (what a job leaves out); a job '
            f"submitted with its own values keeps them. As of {r.e(r.when(now))}.</p>"
        )
        return page(request, "Job types", body)
