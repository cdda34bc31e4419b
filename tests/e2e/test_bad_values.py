"""Values that PostgreSQL or JSON cannot hold, from a handler or in a dashboard filter, over a
whole Conveyor: a clear failure or a 400, never a silent change and never a 500."""

from __future__ import annotations

import math
import uuid

import pytest

from conveyor import Job, JobRouter
from conveyor.core.config import Settings

from ..stack import running_stack, wait_for

router = JobRouter()


@router.job("bad_numbers", max_retries=2)
async def bad_numbers(job: Job) -> object:
    value = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[job.payload["kind"]]
    return {"scores": [1.0, value]}


async def test_a_non_finite_number_in_a_result_fails_the_attempt(settings: Settings) -> None:
    """NaN and ±Infinity are not JSON: the API refuses them in a payload, and a result holding
    one fails its job at once (no retry: the same code returns the same value) with an error
    that names it. (They were stored as null, COMPLETED.)"""
    async with running_stack(settings, router) as stack:
        ids = [await stack.submit("bad_numbers", {"kind": k}) for k in ("nan", "inf", "-inf")]
        assert set((await wait_for(settings.database_url, ids)).values()) == {"FAILED"}
        for job_id in ids:
            job = (await stack.client.get(f"/jobs/{job_id}")).json()
            assert job["result"] is None and job["attempts"] == 1, job
            assert "finite" in job["last_error"] and "scores[1]" in job["last_error"], job


@pytest.mark.parametrize(
    "query",
    ["type=%00", "type=a%00b&status=FAILED", "since=0001-01-01", "since=1969-12-31T23:59:59"],
)
async def test_dashboard_job_filters_never_answer_500(settings: Settings, query: str) -> None:
    """A NUL in a filter is a 400 with the page and a clear message; a time before 1970 means
    every job since the first (no id is older), so the page lists them."""
    async with running_stack(settings, None, maintenance=False) as stack:
        job_id = await stack.submit("echo", {})
        r = await stack.client.get(f"/ui/jobs?{query}")
        if "%00" in query:
            assert r.status_code == 400, r.text
            assert "NUL" in r.text
        else:
            assert r.status_code == 200, r.text
            assert str(uuid.UUID(job_id)) in r.text


async def test_dead_letter_confirm_with_a_nul_answers_400(settings: Settings) -> None:
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        for q in ("action=redrive&type=%00", "action=purge&type=t&error=%00"):
            r = await stack.client.get(f"/ui/dead/confirm?{q}")
            assert r.status_code == 400, (q, r.text)
