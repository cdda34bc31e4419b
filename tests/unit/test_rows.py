"""``JobRow.from_record`` and ``ClaimedJob.from_record`` fill their slots in field order (not
through ``__init__``): each field must get its own column."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from conveyor import JobSpec
from conveyor.api.models import SubmitJob
from conveyor.core.jobs import Status
from conveyor.store.rows import ClaimedJob, JobRow, OutboxRow


def _distinct_record(
    cls: type, json_fields: set[str]
) -> tuple[dict[str, object], dict[str, object]]:
    """A record whose every column holds a value of its own, and the fields it should give."""
    record: dict[str, object] = {}
    expected: dict[str, object] = {}
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i, f in enumerate(dataclasses.fields(cls)):
        column = "wait" if f.name == "wait_seconds" else f.name
        if f.name in json_fields:
            value: object = {"field": f.name}
            record[column] = orjson.dumps(value).decode()
        elif f.name == "status":
            value = Status.RETRYING
            record[column] = "RETRYING"
        elif f.name == "id":
            value = record[column] = uuid.uuid4()
        elif f.name == "depends_on":  # an array column: a tuple of job ids
            value = record[column] = (uuid.uuid4(), uuid.uuid4())
        elif "_at" in f.name:
            value = record[column] = t0 + timedelta(seconds=i)
        else:
            value = record[column] = f"{f.name}-{i}"
        expected[f.name] = value
    return record, expected


@pytest.mark.parametrize(
    ("cls", "json_fields"),
    [
        (JobRow, {"payload", "result", "progress", "meta"}),
        (ClaimedJob, {"payload", "meta", "parents"}),
    ],
)
def test_from_record_puts_each_column_in_its_field(cls: type, json_fields: set[str]) -> None:
    record, expected = _distinct_record(cls, json_fields)
    row = cls.from_record(record)  # type: ignore[attr-defined]
    assert row == cls(**expected)
    assert {f.name: getattr(row, f.name) for f in dataclasses.fields(cls)} == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.id = uuid.uuid4()


def test_job_row_nulls_and_optional_columns() -> None:
    record, _ = _distinct_record(JobRow, {"payload", "result", "progress", "meta"})
    record.update(result=None)
    del record["progress"], record["meta"]  # the submit's insert returns neither
    row = JobRow.from_record(record)
    assert (row.result, row.progress, row.meta) == (None, None, None)
    record["status"] = "NOT_A_STATUS"
    with pytest.raises(ValueError):
        JobRow.from_record(record)


def test_submit_to_spec_sets_exactly_the_job_spec_fields() -> None:
    body = {"type": "t", "payload": {"a": 1}, "priority": "high", "max_retries": 2,
            "timeout_seconds": 3.5, "delay_seconds": 4, "meta": {"m": 1}, "unique_for": 60,
            "unique_key": "k"}  # fmt: skip
    spec = SubmitJob.model_validate(body).to_spec("idem")
    names = [f.name for f in dataclasses.fields(JobSpec)]
    assert sorted(vars(spec)) == sorted(names)
    expected = JobSpec(**{**{n: getattr(spec, n) for n in names}})
    assert spec == expected
    assert (spec.type, spec.payload, spec.priority, spec.idempotency_key) == (
        "t", {"a": 1}, "high", "idem")  # fmt: skip
    assert (spec.max_retries, spec.timeout_seconds, spec.delay_seconds, spec.run_at) == (
        2, 3.5, 4, None)  # fmt: skip
    assert (spec.meta, spec.unique_for, spec.unique_key) == ({"m": 1}, 60, "k")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.type = "other"  # type: ignore[misc]


@pytest.mark.parametrize("traced", [False, True])
def test_outbox_row_from_record(traced: bool) -> None:
    record = {"id": 7, "job_id": uuid.uuid4(), "job_type": "t", "priority": 3,
              "destination": "dead", "delay_seconds": 5, "error": "e", "attempt": 2,
              "trace_context": "00-ab"}  # fmt: skip
    row = OutboxRow.from_record(record, traced=traced)
    expected = {**record, "trace_context": "00-ab" if traced else None}
    assert row == OutboxRow(**expected)  # type: ignore[arg-type]
