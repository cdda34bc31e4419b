"""Structured logs: one ``action`` key per event, ``key=value`` pairs, configured only in entry
points (``configure``). Every line is masked (``secrets.mask``): no URL password, no API key."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

import orjson

from .secrets import mask


class _KeyValueFormatter(logging.Formatter):
    _second, _stamp = -1, ""  # the last second formatted (the API logs every request)

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        if int(record.created) != self._second:
            self._second = int(record.created)
            self._stamp = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        parts = [
            self._stamp,
            record.levelname.lower(),
            record.name,
            record.getMessage(),
        ]
        for k, v in fields.items():
            if k != "traceback":
                parts.append(f"{k}={orjson.dumps(v, default=str).decode()}")
        line = " ".join(parts)
        if fields.get("traceback"):  # a traceback as text (a failed attempt's), below its line
            line += "\n" + str(fields["traceback"]).rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return mask(line)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC), ``level``, ``logger``, ``action`` and the
    fields."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        line.update(fields or {"message": record.getMessage()})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return mask(orjson.dumps(line, default=str).decode())


_format = "text"  # set by ``configure``: how ``say`` writes


def configure(
    level: str = "INFO", fmt: str = "text", *, quiet: Iterable[str] = ("alembic",)
) -> None:
    """``CONVEYOR_LOG_LEVEL`` (debug, info, warning, error) and ``CONVEYOR_LOG_FORMAT`` (text:
    ``key=value``; json: one object per line). The ``quiet`` libraries' loggers only from
    WARNING up."""
    # Record fields no formatter here prints: not computing them saves a fifth of each line's
    # cost (the caller's frame walk above all; see the logging HOWTO, "Optimization").
    global _format
    _format = fmt
    logging.captureWarnings(True)  # a library's warning is a log line too, in the same format
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in quiet:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def event(logger: logging.Logger, action: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event: ``event(log, "job_claimed", job_id=...)``."""
    if logger.isEnabledFor(level):
        logger.log(level, action, extra={"fields": {"action": action, **fields}})


def say(text: str, action: str | None = None, level: int = logging.INFO, **fields: Any) -> None:
    """A line for the person at the terminal (a banner, a one-line error), on stderr: ``text``
    as it is in the text format; in the json format one object (``action`` and ``fields`` when
    given, else ``message``), like every other line of the process."""
    if _format == "json":
        record = logging.LogRecord("conveyor", level, "", 0, text, None, None)
        record.fields = {"action": action, **fields} if action else {"message": text, **fields}
        line = _JsonFormatter().format(record)
    else:
        line = mask(text)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
