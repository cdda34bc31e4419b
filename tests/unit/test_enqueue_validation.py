from __future__ import annotations

import dataclasses
import re
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest

from conveyor import JobRouter
from conveyor.core.errors import IdempotencyConflict, InvalidJob, PayloadTooLarge
from conveyor.jobs.spec import JobSpec, build_job, replayed, spec_hash


def test_build_job_defaults() -> None:
    row = build_job(JobSpec("t"))
    assert row.payload_json == "{}" and row.priority == 5 and row.max_retries is None


@pytest.mark.parametrize(
    "spec",
    [
        JobSpec("bad type"),
        JobSpec("t", payload=[1, 2]),  # type: ignore[arg-type]
        JobSpec("t", payload={"x": object()}),
        JobSpec("t", payload={"x": "nul\x00"}),
        JobSpec("t", priority=11),
        JobSpec("t", max_retries=-1),
        JobSpec("t", timeout_seconds=0),
        JobSpec("t", timeout_seconds=float("nan")),
        JobSpec("t", delay_seconds=-1),
        JobSpec("t", run_at=datetime(2030, 1, 1)),  # naive
        JobSpec("t", run_at=datetime.fromisoformat("2030-01-01T00:00:00+00:00"), delay_seconds=1),
        JobSpec("t", idempotency_key=""),
    ],
)
def test_invalid_specs(spec: JobSpec) -> None:
    with pytest.raises(InvalidJob):
        build_job(spec)


def test_payload_limit() -> None:
    with pytest.raises(PayloadTooLarge):
        build_job(JobSpec("t", payload={"x": "a" * 2000}), max_payload_bytes=1000)


def test_spec_hash_depends_on_the_request() -> None:
    a = spec_hash(JobSpec("t", {"a": 1}))
    assert a == spec_hash(JobSpec("t", {"a": 1}, priority="normal"))
    assert a != spec_hash(JobSpec("t", {"a": 2}))


def test_router_rejects_bad_registrations() -> None:
    r = JobRouter()
    r.job("t")(lambda job: None)
    with pytest.raises(ValueError):
        r.job("t")(lambda job: None)
    for kwargs in ({"max_retries": -1}, {"retry_delays": []}, {"timeout": 0}):
        with pytest.raises(ValueError):
            r.job("u", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidJob):
        r.job("bad type")


def test_routers_combine_and_refuse_a_type_twice() -> None:
    a, b = JobRouter(), JobRouter()
    a.job("x")(lambda job: None)
    b.job("y", max_retries=2)(lambda job: None)
    a.include(b)
    assert a.types == ["x", "y"] and a.handlers["y"].defaults() == {"max_retries": 2}
    with pytest.raises(ValueError):
        a.include(b)


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        (JobSpec("t", payload={"x": float("nan")}), "nan at payload.x"),
        (JobSpec("t", payload={"a": {"b": [1.0, float("inf")]}}), "inf at payload.a.b[1]"),
        (JobSpec("t", payload={"x": (float("-inf"),)}), "-inf at payload.x[0]"),
        (JobSpec("t", payload={"x": None}, meta={"m": float("nan")}), "nan at meta.m"),
    ],
)
def test_non_finite_numbers_are_refused_not_stored_as_null(spec: JobSpec, where: str) -> None:
    """orjson writes NaN and the infinities as ``null``: a job built from Python (``enqueue``,
    a handler's follow-up) would run with a payload other than the one given. The API refuses
    them in a body; Python gets the same refusal, saying where the number is."""
    with pytest.raises(InvalidJob, match=r"numbers must be finite \(" + re.escape(where) + r"\)"):
        build_job(spec)


def test_a_null_that_was_given_is_kept() -> None:
    row = build_job(JobSpec("t", payload={"x": None, "y": [None, 1.5]}, meta={"m": None}))
    assert row.payload_json == '{"x":null,"y":[null,1.5]}'


def test_a_follow_up_with_a_non_finite_number_is_refused_in_the_handler() -> None:
    from conveyor.worker.followups import build_followup

    with pytest.raises(InvalidJob, match=r"nan at payload\.x"):
        build_followup("t", {"x": float("nan")}, {}, max_payload_bytes=1000)


class _KeyedStore:
    """The one statement ``replayed`` runs: the job holding an idempotency key, if any."""

    def __init__(self, *rows: Any) -> None:
        self.rows = {r.idempotency_key: r for r in rows}

    async def job_get_by_idempotency_key(self, conn: object, key: str) -> Any:
        return self.rows.get(key)


async def test_a_replay_returns_the_existing_job_and_anything_else_conflicts() -> None:
    """One rule for ``enqueue_many`` and both API submits: the same key with the same request
    hash is the job the first submit created; a different hash, or no job under the key, is a
    conflict with the caller's words."""
    row = build_job(JobSpec("t", {"a": 1}, idempotency_key="k"))
    first = SimpleNamespace(idempotency_key="k", request_hash=row.request_hash)
    store: Any = _KeyedStore(first)
    assert await replayed(store, None, row, "different") is first  # type: ignore[arg-type]
    other = dataclasses.replace(row, request_hash=spec_hash(JobSpec("t", {"a": 2})))
    with pytest.raises(IdempotencyConflict, match=r"^different$"):
        await replayed(store, None, other, "different")  # type: ignore[arg-type]
    with pytest.raises(IdempotencyConflict, match=r"^gone$"):
        await replayed(_KeyedStore(), None, row, "gone")  # type: ignore[arg-type]
