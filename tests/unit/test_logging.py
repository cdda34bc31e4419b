"""CONVEYOR_LOG_FORMAT / CONVEYOR_LOG_LEVEL: one JSON object per line, levels filter."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from conveyor.core import logging as clog
from conveyor.core.config import Settings


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _capture() -> io.StringIO:
    buf = io.StringIO()
    logging.getLogger().handlers[0].setStream(buf)  # type: ignore[attr-defined]
    return buf


def test_json_format_writes_one_object_per_line(restore_root: None) -> None:
    clog.configure("info", "json")
    buf = _capture()
    log = logging.getLogger("conveyor.test")
    clog.event(log, "job_claimed", job_id="j1", attempt=2)
    clog.event(log, "too_chatty", logging.DEBUG, n=1)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("plain message")
    lines = [orjson.loads(line) for line in buf.getvalue().splitlines()]
    assert lines[0]["action"] == "job_claimed" and lines[0]["attempt"] == 2
    assert lines[0]["level"] == "info" and lines[0]["ts"].endswith("Z")
    assert lines[1]["message"] == "plain message" and "ValueError: boom" in lines[1]["exception"]
    assert len(lines) == 2  # debug filtered out


def test_settings_read_the_log_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_LOG_FORMAT", "json")
    monkeypatch.setenv("CONVEYOR_LOG_LEVEL", "debug")
    s = Settings()
    assert (s.log_format, s.log_level) == ("json", "debug")
    monkeypatch.setenv("CONVEYOR_LOG_FORMAT", "xml")
    with pytest.raises(ValueError):
        Settings()
