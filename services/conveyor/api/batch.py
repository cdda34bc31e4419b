"""Request bodies → validated rows. A batch is refused cheapest first: the item count (streamed,
stops at the first item over the limit), then the strict parse, then each job's validation.

Both raise only the documented errors: ``BodyError`` (400/422), ``TooManyJobs`` (422),
pydantic's ``ValidationError`` (422), ``InvalidJob`` (422) and its ``PayloadTooLarge`` (413)."""

from __future__ import annotations

import dataclasses

from ..core.errors import InvalidJob
from ..jobs.spec import build_job, check_idempotency_key, request_digest, spec_hash
from ..store import NewJob
from .body import TooManyJobs, count_batch_items, parse_json
from .models import SubmitBatch, SubmitJob

# Separates a batch's Idempotency-Key from the job index in each row's key; HTTP header values
# cannot contain this control character, so no single submit's key can collide with it.
KEY_SEPARATOR = "\x1f"


def build_submit(body: bytes, *, max_payload_bytes: int, idempotency_key: str | None) -> NewJob:
    job = SubmitJob.model_validate(parse_json(body))
    return build_job(job.to_spec(idempotency_key), max_payload_bytes=max_payload_bytes)


def build_batch(
    body: bytes, *, max_batch: int, max_payload_bytes: int, idempotency_key: str | None
) -> list[NewJob]:
    """Raises ``TooManyJobs``, ``BodyError``, pydantic's ``ValidationError`` or ``InvalidJob``
    (its message names the job's index)."""
    count_batch_items(body, max_batch)  # streamed, for bodies over PRECHECK_BYTES only
    data = parse_json(body)
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if isinstance(jobs, list) and len(jobs) > max_batch:  # before validating each item
        raise TooManyJobs(max_batch)
    batch = SubmitBatch.model_validate(data)
    specs = [j.to_spec() for j in batch.jobs]
    rows = []
    for i, spec in enumerate(specs):
        try:
            rows.append(build_job(spec, max_payload_bytes=max_payload_bytes))
        except InvalidJob as exc:
            raise type(exc)(f"jobs[{i}]: {exc}") from None
    if idempotency_key is None:
        return rows
    check_idempotency_key(idempotency_key)
    request_hash = request_digest([spec_hash(spec) for spec in specs])
    return [
        dataclasses.replace(
            r, idempotency_key=f"{idempotency_key}{KEY_SEPARATOR}{i}", request_hash=request_hash
        )
        for i, r in enumerate(rows)
    ]
