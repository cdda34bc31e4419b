"""Structured logs: one ``action`` key per event, ``key=value`` pairs, configured only in entry
points (``configure``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

import orjson


class _KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        parts = [
            self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            record.levelname.lower(),
            record.name,
            record.getMessage(),
        ]
        for k, v in fields.items():
            parts.append(f"{k}={orjson.dumps(v, default=str).decode()}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str = "INFO", *, quiet: Iterable[str] = ("alembic",)) -> None:
    """Key=value lines on stderr; the ``quiet`` libraries' loggers only from WARNING up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in quiet:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def event(logger: logging.Logger, action: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event: ``event(log, "job_claimed", job_id=...)``."""
    if logger.isEnabledFor(level):
        logger.log(level, action, extra={"fields": {"action": action, **fields}})
