"""HTML for the dashboard, rendered on the server. Every value from the database (types,
payloads, results, errors, worker ids) goes through ``e`` (``html.escape``), so a payload holding
``<script>`` shows as text. No template engine, no build step, no CDN."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import orjson

from ...core.jobs import Status
from ...store import AttemptRow, JobRow
from ..resource import error_summary

ACTIVE = ["WAITING", "SCHEDULED", "PENDING", "RETRYING", "IN_PROGRESS", "FAILED"]


def e(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def when(value: datetime | None) -> str:
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "—"
    s = max(0, int((now - value).total_seconds()))
    return f"{s // 3600}h {s % 3600 // 60}m" if s >= 3600 else f"{s // 60}m {s % 60}s"


def secs(value: float | None) -> str:
    return "—" if value is None else (f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s")


def pretty(value: Any) -> str:
    return e(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


def link(path: str, text: Any, **query: Any) -> str:
    q = {k: v for k, v in query.items() if v not in (None, "")}
    return f'<a href="{e(path + ("?" + urlencode(q) if q else ""))}">{e(text)}</a>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, id_: str = "") -> str:
    """``rows`` hold HTML already escaped by the caller."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    ident = f' id="{e(id_)}"' if id_ else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, body: str, *, user: str = "") -> str:
    """``user``: the logged-in key's name, shown with a Log out button."""
    nav = " ".join(
        link(p, t)
        for p, t in (
            ("/ui", "Overview"),
            ("/ui/jobs", "Jobs"),
            ("/ui/workflows", "Workflows"),
            ("/ui/dead", "Dead letters"),
            ("/ui/types", "Types"),
            ("/ui/schedules", "Schedules"),
        )
    )
    if user:
        nav += (
            f' <span class="muted" id="user">{e(user)}</span> <form method="post" '
            'action="/ui/logout" class="inline"><button type="submit">Log out</button></form>'
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)} · Conveyor</title>"
        '<link rel="icon" href="/favicon.ico" type="image/png">'
        '<link rel="stylesheet" href="/ui/static/style.css">'
        '<script src="/ui/static/app.js" defer></script></head>'
        f"<body><header><strong>Conveyor</strong> <nav>{nav}</nav></header>"
        f"<main><h1>{e(title)}</h1>{body}</main></body></html>"
    )


def overview_table(
    backlog: dict[str, dict[str, tuple[int, datetime]]],
    hour: dict[str, dict[str, Any]],
    now: datetime,
) -> str:
    types = sorted(set(backlog) | set(hour))
    rows = []
    for t in types:
        counts = backlog.get(t, {})
        h = hour.get(t, {})
        done, failed = int(h.get("completed") or 0), int(h.get("failed") or 0)
        rate = f"{100 * failed / (done + failed):.1f} %" if done + failed else "—"
        cells = [link("/ui/jobs", t, type=t)]
        cells += [
            link("/ui/jobs", counts[s][0], type=t, status=s) if s in counts else "0" for s in ACTIVE
        ]
        cells += [
            e(done),
            e(failed),
            e(rate),
            e(secs(h.get("wait_p50"))),
            e(secs(h.get("wait_p95"))),
            e(age(counts.get("PENDING", (0, None))[1], now)),
        ]
        rows.append(cells)
    headers = [
        "type",
        *ACTIVE,
        "completed 1h",
        "failed 1h",
        "failure rate 1h",
        "wait p50",
        "wait p95",
        "oldest pending",
    ]
    if not rows:
        return '<p id="overview-empty">No jobs yet.</p>'
    return table(headers, rows, id_="overview")


def jobs_table(rows: Sequence[JobRow]) -> str:
    return table(
        ["id", "type", "status", "attempts", "created", "finished", "last error"],
        [
            [
                link(f"/ui/jobs/{r.id}", r.id),
                e(r.job_type),
                f'<span class="s-{e(r.status.value)}">{e(r.status.value)}</span>',
                e(r.attempts),
                e(when(r.created_at)),
                e(when(r.finished_at)),
                e((error_summary(r.last_error) or "")[:120]),
            ]
            for r in rows
        ],
        id_="jobs",
    )


def button(action: str, label: str, *, csrf: str = "", **fields: str) -> str:
    """A form POST carrying the page's CSRF token."""
    fields = {"csrf": csrf, **fields} if csrf else fields
    hidden = "".join(
        f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in fields.items()
    )
    return (
        f'<form method="post" action="{e(action)}" class="inline">{hidden}'
        f'<button type="submit" name="go" value="1">{e(label)}</button></form>'
    )


def _progress(p: dict[str, object] | None) -> str | None:
    """``job.set_progress``'s last report: ``42 % — message (at …)``."""
    if not p:
        return None
    text = f"{p.get('percent')} %"
    return text + (f" — {p['message']}" if p.get("message") else "") + f" ({p.get('updated_at')})"


def job_detail(
    row: JobRow,
    attempts: Sequence[AttemptRow],
    *,
    csrf: str = "",
    full_errors: bool = True,
    can_cancel: bool = True,
    can_retry: bool = True,
) -> str:
    """``full_errors`` False (not ``admin``): each error reduced to its last line, without the
    traceback's server paths."""

    def err(text: str | None) -> str | None:
        return text if full_errors else error_summary(text)

    fields = [
        ("id", row.id),
        ("type", row.job_type),
        ("status", row.status.value),
        ("priority", row.priority),
        ("attempts", row.attempts),
        (
            "retries used",
            f"{row.retry_count} of {row.max_retries if row.max_retries is not None else '—'}",
        ),
        ("worker", row.worker_id),
        ("created", when(row.created_at)),
        ("run at", when(row.run_at)),
        ("started", when(row.started_at)),
        ("finished", when(row.finished_at)),
        ("updated", when(row.updated_at)),
        ("cancel requested", row.cancel_requested),
        ("progress", _progress(row.progress)),
        ("last error", err(row.last_error)),
    ]
    actions = []
    running = (
        Status.WAITING,
        Status.PENDING,
        Status.SCHEDULED,
        Status.RETRYING,
        Status.IN_PROGRESS,
    )
    if can_cancel and row.status in running:
        actions.append(button(f"/ui/jobs/{row.id}/cancel", "Cancel", csrf=csrf))
    if can_retry and row.status in (Status.FAILED, Status.CANCELLED):
        actions.append(button(f"/ui/jobs/{row.id}/retry", "Retry", csrf=csrf))
    attempt_rows = [
        [
            e(a.attempt),
            e(a.worker_id),
            e(when(a.started_at)),
            e(when(a.finished_at)),
            e(a.outcome or "running"),
            e(secs(a.duration_seconds)),
            f"<pre>{e(err(a.error))}</pre>" if a.error else "",
        ]
        for a in attempts
    ]
    wf = row.workflow_id
    workflow = f'<p id="workflow">Workflow {link(f"/ui/workflows/{wf}", wf)}</p>' if wf else ""
    return (
        f'<div class="actions">{"".join(actions)}</div>{workflow}'
        + table(["field", "value"], [[e(k), e(v)] for k, v in fields], id_="fields")
        + f'<h2>Payload</h2><pre id="payload">{pretty(row.payload)}</pre>'
        + f'<h2>Result</h2><pre id="result">{pretty(row.result)}</pre>'
        + "<h2>Attempts</h2>"
        + table(
            ["attempt", "worker", "started", "finished", "outcome", "duration", "error"],
            attempt_rows,
            id_="attempts",
        )
    )
