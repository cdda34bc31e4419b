"""The wire format: a small JSON body naming the job. The payload stays in PostgreSQL (the
worker reads it in the claim), so messages are tiny whatever the payload size."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import orjson

CONTENT_TYPE = "application/json"
MAX_MESSAGE_BYTES = 4096


class MalformedMessage(ValueError):
    """The body is not a Conveyor job message."""


@dataclass(frozen=True, slots=True)
class JobMessage:
    job_id: uuid.UUID
    job_type: str

    def encode(self) -> bytes:
        return orjson.dumps({"id": str(self.job_id), "type": self.job_type})


def decode(body: bytes) -> JobMessage:
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
    try:
        job_id = uuid.UUID(raw_id)
    except ValueError:
        raise MalformedMessage(f"'id' is not a UUID: {raw_id[:64]!r}") from None
    return JobMessage(job_id, job_type)
