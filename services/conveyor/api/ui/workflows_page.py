"""The dashboard's workflow pages: ``/ui/workflows`` (newest first, filtered by status, with
their jobs' counts, in keyset pages) and ``/ui/workflows/{id}`` (each job with its status and
the jobs it waits for, linked to their job pages). Reads go through the store calls of
``GET /workflows``; every value is escaped (``render.e``)."""

from __future__ import annotations

import uuid

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ...store.workflows import WorkflowJob, WorkflowRow
from ...workflows import get_workflow
from ..attempts import HasConnection
from ..auth import CURRENT
from ..resource import error_summary
from ..workflows import ordered
from . import render as r
from .session import html

PAGE = 50
STATUSES = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED")
COUNTS = ("jobs", "waiting", "queued", "running", "completed", "failed", "cancelled")


def _page(request: Request, title: str, body: str, status: int = 200) -> Response:
    p = CURRENT.get()
    user = p.name if p is not None and p.via == "session" else ""
    return html(request, r.page(title, body, user=user), status)


def _status(value: str) -> str:
    return f'<span class="s-{r.e(value)}">{r.e(value)}</span>'


def workflows_table(rows: list[WorkflowRow]) -> str:
    if not rows:
        return '<p id="workflows-empty">No workflows.</p>'
    return r.table(
        ["name", "status", *COUNTS, "created", "finished"],
        [
            [
                r.link(f"/ui/workflows/{w.id}", w.name),
                _status(w.status),
                *(r.e(getattr(w, n)) for n in COUNTS),
                r.e(r.when(w.created_at)),
                r.e(r.when(w.finished_at)),
            ]
            for w in rows
        ],
        id_="workflows",
    )


def workflow_detail(row: WorkflowRow, jobs: list[WorkflowJob]) -> str:
    jobs = ordered(jobs)
    ids = {j.key: j.id for j in jobs}
    fields = [
        ("id", row.id),
        ("name", row.name),
        ("status", row.status),
        ("on failure", row.on_failure),
        ("created", r.when(row.created_at)),
        ("finished", r.when(row.finished_at)),
        *((n, getattr(row, n)) for n in COUNTS),
    ]
    return (
        r.table(["field", "value"], [[r.e(k), r.e(v)] for k, v in fields], id_="fields")
        + "<h2>Jobs</h2>"
        + r.table(
            ["key", "job", "type", "status", "waits for", "last error"],
            [
                [
                    r.e(j.key),
                    r.link(f"/ui/jobs/{j.id}", j.id),
                    r.e(j.job_type),
                    _status(j.status),
                    ", ".join(r.link(f"/ui/jobs/{ids[k]}", k) for k in j.after) or "—",
                    r.e((error_summary(j.last_error) or "")[:120]),
                ]
                for j in jobs
            ],
            id_="jobs",
        )
    )


def add_workflows_page(app: FastAPI, api: HasConnection) -> None:
    @app.get("/ui/workflows", include_in_schema=False)
    async def ui_workflows(
        request: Request, status: str | None = None, before: uuid.UUID | None = None
    ) -> Response:
        status = status.upper() if status and status.upper() in STATUSES else None
        async with api.connection() as conn:
            rows = await api.store.workflow_page(
                conn, status=status, name=None, before=before, limit=PAGE + 1
            )
        filters = " ".join(
            r.link("/ui/workflows", s, status=s) if s != status else f"<strong>{r.e(s)}</strong>"
            for s in STATUSES
        )
        body = f'<p id="filters">{r.link("/ui/workflows", "all")} {filters}</p>'
        body += workflows_table(rows[:PAGE])
        if len(rows) > PAGE:
            older = r.link("/ui/workflows", "Older →", status=status, before=rows[PAGE - 1].id)
            body += f'<p id="older">{older}</p>'
        return _page(request, "Workflows", body)

    @app.get("/ui/workflows/{workflow_id:uuid}", include_in_schema=False)
    async def ui_workflow(request: Request, workflow_id: uuid.UUID) -> Response:
        async with api.connection() as conn:
            found = await get_workflow(conn, workflow_id, schema=api.store.schema)
        if found is None:
            return _page(request, "Not found", f"<p>No workflow {r.e(workflow_id)}.</p>", 404)
        return _page(request, f"Workflow {found[0].name}", workflow_detail(*found))
