"""The wire format: ONE encoder and ONE decoder for every message Conveyor sends — work, retry
and dead-letter alike — and the AMQP properties they carry.

A message is a small JSON object naming the job; the payload stays in PostgreSQL (the worker
reads it in its claim), so messages are tiny whatever the payload:

- work and retry: ``{"id": "<uuid>", "type": "<job type>"}``;
- dead letter: the same plus ``"attempt"`` (the attempt whose failure it records, so a redrive
  is fenced by it) and ``"error"`` (the last error, at most ``MAX_ERROR_CHARS``).

Properties: persistent, ``content_type`` JSON, ``message_id`` = job id, ``priority`` set, and
with tracing on the header ``traceparent``.
``decode`` raises nothing but ``MalformedMessage``, whatever the bytes (a property test holds
it to that).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import orjson
from pamqp.commands import Basic

CONTENT_TYPE = "application/json"
MAX_ERROR_CHARS = 2000
# a dead letter's error may be 2000 characters of six-byte JSON escapes
MAX_MESSAGE_BYTES = 32 * 1024
MAX_ATTEMPT = 2**31 - 1  # the ``attempts`` column is int4
PERSISTENT = 2
_CANONICAL_UUID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
TRACEPARENT = "traceparent"  # the W3C Trace Context header (tracing on)


class MalformedMessage(ValueError):
    """The body is not a Conveyor job message."""


@dataclass(frozen=True, slots=True)
class JobMessage:
    job_id: uuid.UUID
    job_type: str
    attempt: int | None = None  # dead letters: the attempt that failed
    error: str | None = None  # dead letters: its error

    def encode(self) -> bytes:
        return encode(self.job_id, self.job_type, attempt=self.attempt, error=self.error)


def encode(
    job_id: uuid.UUID, job_type: str, *, attempt: int | None = None, error: str | None = None
) -> bytes:
    """The body of a work, retry (no ``attempt``/``error``) or dead-letter message."""
    if attempt is None and error is None:
        return orjson.dumps({"id": str(job_id), "type": job_type})
    if error is not None:
        error = error[:MAX_ERROR_CHARS]
    try:
        return orjson.dumps(
            {"id": str(job_id), "type": job_type, "attempt": attempt, "error": error}
        )
    except orjson.JSONEncodeError:  # lone surrogates: not UTF-8
        clean = None if error is None else error.encode("utf-8", "replace").decode("utf-8")
        kind = job_type.encode("utf-8", "replace").decode("utf-8")
        return orjson.dumps({"id": str(job_id), "type": kind, "attempt": attempt, "error": clean})


def decode(body: bytes) -> JobMessage:
    """The message in ``body``; ``MalformedMessage`` for anything else."""
    if len(body) > MAX_MESSAGE_BYTES:
        raise MalformedMessage(f"message body of {len(body)} bytes is too large")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedMessage(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedMessage("not a JSON object")
    raw_id, job_type = data.get("id"), data.get("type")
    if not isinstance(raw_id, str) or not isinstance(job_type, str):
        raise MalformedMessage("missing 'id' or 'type'")
    if _CANONICAL_UUID.fullmatch(raw_id):  # once per delivery: cheaper than str(job_id)
        job_id = uuid.UUID(raw_id)
    else:  # uuid.UUID also takes braces, URNs, non-ASCII digits: say which it is
        try:
            uuid.UUID(raw_id)
        except ValueError:
            raise MalformedMessage(f"'id' is not a UUID: {raw_id[:64]!r}") from None
        raise MalformedMessage(f"'id' is not a canonical UUID: {raw_id[:64]!r}")
    attempt, error = data.get("attempt"), data.get("error")
    if attempt is not None and (type(attempt) is not int or not 1 <= attempt <= MAX_ATTEMPT):
        raise MalformedMessage(f"'attempt' is not a positive int4: {str(attempt)[:32]!r}")
    if error is not None and not isinstance(error, str):
        raise MalformedMessage("'error' is not a string")
    return JobMessage(job_id, job_type, attempt, error)


def properties(job_id: str, priority: int, traceparent: str | None = None) -> Basic.Properties:
    """The AMQP properties of every Conveyor message; with tracing on, the header
    ``traceparent`` (W3C) carries the publish span's context to the worker."""
    return Basic.Properties(
        content_type=CONTENT_TYPE,
        delivery_mode=PERSISTENT,
        message_id=job_id,
        priority=priority,
        headers={TRACEPARENT: traceparent} if traceparent is not None else None,
    )


def traceparent_of(headers: object) -> str | None:
    """The ``traceparent`` header of a delivery's headers (as published: text; a broker or
    another client may hand bytes), unchecked; ``core.tracing.valid`` decides."""
    if not isinstance(headers, dict):
        return None
    value = headers.get(TRACEPARENT)
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value if isinstance(value, str) else None
