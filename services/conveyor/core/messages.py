"""Moved to ``conveyor.broker.wire`` (issue 10: one encoder and one decoder). Kept as a
re-export until the worker imports ``conveyor.broker`` directly; then delete it."""

from __future__ import annotations

from ..broker.wire import CONTENT_TYPE, MAX_MESSAGE_BYTES, JobMessage, MalformedMessage, decode

__all__ = ["CONTENT_TYPE", "MAX_MESSAGE_BYTES", "JobMessage", "MalformedMessage", "decode"]
