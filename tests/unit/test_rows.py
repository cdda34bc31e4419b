"""``JobRow.from_record`` and ``ClaimedJob.from_record`` fill their slots in field order (not
through ``__init__``): each field must get its own column."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from conveyor.core.jobs import Status
from conveyor.store.rows import ClaimedJob, JobRow


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
        (ClaimedJob, {"payload", "meta"}),
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
