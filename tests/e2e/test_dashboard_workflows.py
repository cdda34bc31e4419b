"""The dashboard's workflow pages (/ui/workflows, /ui/workflows/{id}): over HTTP, the list
(newest first, counts, status filter, keyset pages) and a workflow's jobs with the jobs they
wait for, linked to the job pages; in a real browser (Debian's Chromium through Playwright),
the nav link, the clicks through to a job, and a workflow name and key that are markup shown as
text. Screenshot: workflows.png (docs/img with CONVEYOR_UI_SCREENSHOTS=docs/img)."""

from __future__ import annotations

import html
import uuid
from pathlib import Path

import asyncpg

from conveyor.core.config import Settings

from ..stack import running_stack
from . import test_dashboard as dashboard
from .test_workflows_api import FAN

browser_page = dashboard.browser_page  # the fixture: Chromium through Playwright


async def test_workflow_pages_over_http(settings: Settings, db: asyncpg.Connection) -> None:
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        c = stack.client
        old = (await c.post("/workflows", json={**FAN, "name": "old"})).json()
        await c.post(f"/workflows/{old['id']}/cancel")
        evil = {**FAN, "name": dashboard.XSS}
        evil["jobs"] = [dict(j) for j in FAN["jobs"]]
        evil["jobs"][0]["key"] = "<b>k</b>"
        evil["jobs"][1]["after"] = ["<b>k</b>"]
        evil["jobs"][2]["after"] = ["<b>k</b>"]
        wf = (await c.post("/workflows", json=evil)).json()

        page = await c.get("/ui/workflows")
        assert page.status_code == 200
        text = page.text
        assert '<a href="/ui/workflows">Workflows</a>' in text  # the nav link
        assert dashboard.XSS not in text and html.escape(dashboard.XSS, quote=True) in text
        assert text.index(f"/ui/workflows/{wf['id']}") < text.index(f"/ui/workflows/{old['id']}")
        assert "CANCELLED" in text and "RUNNING" in text
        assert "content-security-policy" in page.headers
        cancelled = (await c.get("/ui/workflows", params={"status": "CANCELLED"})).text
        assert old["id"] in cancelled and wf["id"] not in cancelled

        one = await c.get(f"/ui/workflows/{wf['id']}")
        assert one.status_code == 200
        assert "<b>k</b>" not in one.text and "&lt;b&gt;k&lt;/b&gt;" in one.text
        jobs = {j["key"]: j["id"] for j in wf["jobs"]}
        for job_id in jobs.values():
            assert f'href="/ui/jobs/{job_id}"' in one.text
        # "report" waits for a and b: both linked in its row
        row = one.text.split(f">{jobs['report']}</a>")[1].split("</tr>")[0]
        assert f'href="/ui/jobs/{jobs["a"]}">a</a>' in row
        assert f'href="/ui/jobs/{jobs["b"]}">b</a>' in row
        assert (await c.get(f"/ui/workflows/{uuid.uuid4()}")).status_code == 404
        job_page = (await c.get(f"/ui/jobs/{jobs['report']}")).text  # and back to the workflow
        assert f'href="/ui/workflows/{wf["id"]}"' in job_page

        for i in range(51):  # a second page
            await c.post("/workflows", json={"name": f"w{i}", "jobs": [{"key": "k", "type": "t"}]})
        first = (await c.get("/ui/workflows")).text
        assert 'id="older"' in first and wf["id"] not in first
        older = first.split('id="older"><a href="')[1].split('"')[0]
        second = (await c.get(html.unescape(older))).text
        assert wf["id"] in second and old["id"] in second and 'id="older"' not in second


async def test_workflow_pages_in_a_browser(
    settings: Settings, db: asyncpg.Connection, browser_page: object, tmp_path: Path
) -> None:
    p: object = browser_page
    goto, text, click = p.goto, p.inner_text, p.click  # type: ignore[attr-defined]
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        base = str(stack.client.base_url)
        r = await stack.client.post("/workflows", json={**FAN, "name": dashboard.XSS})
        wf = r.json()
        await goto(f"{base}/ui")
        await click("nav >> text=Workflows")
        await p.wait_for_url("**/ui/workflows")  # type: ignore[attr-defined]
        header = (await text("#workflows thead")).split("\t")
        row = dict(zip(header, (await text("#workflows tbody")).split("\t"), strict=True))
        assert (row["name"], row["status"], row["jobs"], row["waiting"]) == (
            dashboard.XSS, "RUNNING", "4", "3"
        )  # fmt: skip
        assert await p.evaluate("window.pwned === undefined")  # type: ignore[attr-defined]
        await click("#workflows tbody a")
        await p.wait_for_url(f"**/ui/workflows/{wf['id']}")  # type: ignore[attr-defined]
        assert await p.evaluate("window.pwned === undefined")  # type: ignore[attr-defined]
        lines = (await text("#jobs tbody")).splitlines()
        report = next(line.split("\t") for line in lines if line.startswith("report"))
        assert report[3] == "WAITING" and report[4] == "a, b"
        shots = dashboard._shots(tmp_path)
        await p.screenshot(path=str(shots / "workflows.png"), full_page=True)  # type: ignore[attr-defined]
        await click("#jobs tbody tr:has-text('report') a:text-is('a')")
        job_a = next(j["id"] for j in wf["jobs"] if j["key"] == "a")
        await p.wait_for_url(f"**/ui/jobs/{job_a}")  # type: ignore[attr-defined]
