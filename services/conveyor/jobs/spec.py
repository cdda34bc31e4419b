"""A submitted job, validated: ``JobSpec`` (what a caller gives) becomes a ``NewJob`` row
(``build_job``), with the request hash an idempotency key is checked against (``spec_hash``).
Also the submit options of the job features, ``meta`` (a small JSON object handed to handlers)
and unique jobs (``unique_for`` seconds, ``unique_key``), the schedule horizon, and how a JSON
object is encoded for jsonb (payloads, meta and schedule payloads alike). Validation is pure,
shared by the API, ``enqueue()`` and a handler's follow-ups; the database enforces uniqueness
(``store/jobs.py``), and ``replayed`` says what a submit whose idempotency key is taken gets."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson

from ..core.errors import IdempotencyConflict, InvalidJob, PayloadTooLarge
from ..core.jobs import check_type, new_job_id, parse_priority
from ..store import Connection, Debounce, JobRow, NewJob, Store

DEFAULT_MAX_PAYLOAD = 256 * 1024
MAX_DELAY_SECONDS = 10 * 365 * 86400
MIN_TIMEOUT_SECONDS = 0.001
MAX_TIMEOUT_SECONDS = 7 * 86400
MAX_IDEMPOTENCY_KEY = 255
MAX_META_BYTES = 8 * 1024
MAX_UNIQUE_FOR = 366 * 86400  # a year (and a day)
MAX_UNIQUE_KEY = 255
MAX_PARTITION_KEY = 200
MAX_DEBOUNCE = 86400.0  # a day

# A real NUL in a string or key, as orjson writes it: ``\u0000`` preceded by an even number of
# backslashes (the text ``\\u0000``, a backslash then "u0000", is not a NUL and is allowed).
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# orjson writes floats of 1e16 and above with an exponent ("4.324448394381094e+16"); jsonb keeps
# the number but prints it as an integer, which a reader parses as a different (int) value.
_POSITIVE_EXPONENT = re.compile(rb"[0-9]e\+")
# asyncpg writes these two instants as PostgreSQL's -infinity / infinity
_DATETIME_SENTINELS = (datetime.min, datetime.max)


def _plain_floats(value: Any) -> Any:
    """``value`` with every float of 1e16 and above as a fixed-point fragment ending in ``.0``:
    jsonb keeps that scale, so the number reads back as the same float."""
    if isinstance(value, float):
        if math.isfinite(value) and abs(value) >= 1e16:
            return orjson.Fragment(f"{Decimal(repr(value)):f}.0".encode())
        return value
    if isinstance(value, Mapping):
        return {k: _plain_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_floats(v) for v in value]
    return value


def dump_json(value: Any) -> bytes:
    """``value`` as JSON for a jsonb column, reading back as the same value (keys that are not
    strings written as strings). Raises ``TypeError`` for what JSON cannot hold."""
    text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    if _POSITIVE_EXPONENT.search(text):
        text = orjson.dumps(_plain_floats(value), option=orjson.OPT_NON_STR_KEYS)
    return text


def encode_object(
    value: Any,
    name: str,
    limit: int,
    *,
    error: type[InvalidJob] = InvalidJob,
    too_large: type[InvalidJob] | None = None,
) -> bytes:
    """``value`` (the JSON object called ``name``) as stored. Raises ``error`` for a value that is
    not a JSON object, not JSON-serialisable, or holds a non-finite number or a NUL (PostgreSQL
    jsonb rejects them), and ``too_large`` (default ``error``) over ``limit`` bytes of UTF-8."""
    if not isinstance(value, Mapping):
        raise error(f"{name} must be a JSON object")
    try:
        text = dump_json(value)
    except TypeError as exc:
        raise error(f"{name} is not JSON-serialisable: {exc}") from None
    if (where := check_finite(value, text, name)) is not None:
        raise error(where)
    if _NUL.search(text):
        raise error(f"{name} must not contain NUL characters (PostgreSQL jsonb rejects them)")
    if len(text) > limit:
        raise (too_large or error)(f"{name} is {len(text)} bytes of UTF-8; the limit is {limit}")
    return text


def check_run_at(run_at: datetime) -> datetime:
    """``run_at`` must carry an offset and fall strictly inside years 1-9999 in UTC."""
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidJob("run_at must carry a timezone (ISO 8601 with an offset or Z)")
    try:
        utc = run_at.astimezone(UTC)
    except OverflowError:
        raise InvalidJob("run_at must fall inside years 1-9999 in UTC") from None
    if utc.replace(tzinfo=None) in _DATETIME_SENTINELS:
        raise InvalidJob("run_at must fall strictly inside years 1-9999 in UTC")
    return run_at


def check_horizon(rows: Sequence[NewJob], max_days: float) -> None:
    """Quota: no job due further ahead than ``max_days`` (a run_at in year 9000 would sit in
    the due index for ever). Raises ``InvalidJob`` (422)."""
    try:
        limit = datetime.now(UTC) + timedelta(days=max_days)
    except OverflowError:  # a horizon past year 9999: no limit but the run_at range itself
        return
    for i, row in enumerate(rows):
        if row.run_at is not None and row.run_at > limit:
            where = f"jobs[{i}]: " if len(rows) > 1 else ""
            raise InvalidJob(
                f"{where}run_at is more than {max_days:g} days ahead (CONVEYOR_MAX_SCHEDULE_DAYS)"
            )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class JobSpec:
    """What a caller gives for one job (the REST submit body maps onto this)."""

    type: str
    payload: Mapping[str, Any] | None = None
    priority: int | str | None = None
    max_retries: int | None = None
    timeout_seconds: float | None = None
    run_at: datetime | None = None
    delay_seconds: float | None = None
    idempotency_key: str | None = None
    meta: Mapping[str, Any] | None = None  # ≤ 8 KiB, handed to handlers
    unique_for: float | None = None  # seconds a second submit returns this job
    unique_key: str | None = None  # default: type + canonical payload
    partition_key: str | None = None  # default: the type's partition_by fields
    debounce_seconds: float | None = None
    debounce_max_seconds: float | None = None
    debounce_key: str | None = None


def check_partition_key(key: object) -> str:
    """A partition key as a submit gives it and an operator names it: 1 to
    ``MAX_PARTITION_KEY`` characters, no NUL (PostgreSQL's text refuses it)."""
    if not (isinstance(key, str) and 0 < len(key) <= MAX_PARTITION_KEY):
        raise InvalidJob(f"partition_key must be a string of 1 to {MAX_PARTITION_KEY} characters")
    if "\x00" in key:
        raise InvalidJob("partition_key must not contain NUL characters")
    return key


def check_idempotency_key(key: str) -> str:
    if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise InvalidJob(f"an idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY} characters")
    return key


def build_job(
    spec: JobSpec,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
    request_hash: str | None = None,
) -> NewJob:
    """Validate ``spec`` and turn it into a row. Raises ``InvalidJob`` / ``PayloadTooLarge``."""
    check_type(spec.type)
    payload = {} if spec.payload is None else spec.payload
    payload_json = encode_object(payload, "payload", max_payload_bytes, too_large=PayloadTooLarge)
    if spec.max_retries is not None and not (
        isinstance(spec.max_retries, int)
        and not isinstance(spec.max_retries, bool)
        and 0 <= spec.max_retries <= 1000
    ):
        raise InvalidJob("max_retries must be an integer between 0 and 1000")
    if spec.timeout_seconds is not None and not (
        _is_number(spec.timeout_seconds)
        and math.isfinite(spec.timeout_seconds)
        and MIN_TIMEOUT_SECONDS <= spec.timeout_seconds <= MAX_TIMEOUT_SECONDS
    ):
        raise InvalidJob("timeout_seconds must be a number from 0.001 to 604800 (a week)")
    if spec.run_at is not None and spec.delay_seconds is not None:
        raise InvalidJob("give run_at or delay_seconds, not both")
    if spec.run_at is not None:
        if not isinstance(spec.run_at, datetime):
            raise InvalidJob("run_at must be a datetime")
        check_run_at(spec.run_at)
    if spec.delay_seconds is not None and not (
        _is_number(spec.delay_seconds)
        and math.isfinite(spec.delay_seconds)
        and 0 <= spec.delay_seconds <= MAX_DELAY_SECONDS
    ):
        raise InvalidJob("delay_seconds must be a number from 0 to ten years")
    if spec.idempotency_key is not None:
        check_idempotency_key(spec.idempotency_key)
        if request_hash is None:
            request_hash = spec_hash(spec)
    if spec.partition_key is not None:
        check_partition_key(spec.partition_key)
    debounce = debounce_of(spec)
    unique = unique_key_for(spec.type, payload, spec.unique_for, spec.unique_key)
    meta = spec.meta
    meta_json = None if meta is None else encode_object(meta, "meta", MAX_META_BYTES).decode()
    return NewJob(
        id=new_job_id(),
        job_type=spec.type,
        payload_json=payload_json.decode(),
        priority=parse_priority(spec.priority),
        max_retries=spec.max_retries,
        timeout_seconds=spec.timeout_seconds,
        run_at=spec.run_at,
        delay_seconds=spec.delay_seconds,
        idempotency_key=spec.idempotency_key,
        request_hash=request_hash,
        meta_json=meta_json,
        unique_key=unique,
        unique_for=spec.unique_for if unique is not None else None,
        partition_key=spec.partition_key,
        debounce=debounce,
    )


def debounce_of(spec: JobSpec) -> Debounce | None:
    """The checked debounce options of ``spec`` (None: not debounced)."""
    if spec.debounce_seconds is None:
        if spec.debounce_max_seconds is not None or spec.debounce_key is not None:
            raise InvalidJob("debounce_max_seconds and debounce_key need debounce_seconds")
        return None
    seconds, most = spec.debounce_seconds, spec.debounce_max_seconds
    if not (_is_number(seconds) and math.isfinite(seconds) and 0 < seconds <= MAX_DEBOUNCE):
        raise InvalidJob(f"debounce_seconds must be a number above 0, at most {MAX_DEBOUNCE}")
    most = 10 * seconds if most is None else most
    if not (_is_number(most) and math.isfinite(most) and 0 < most <= 10 * MAX_DEBOUNCE):
        raise InvalidJob(
            f"debounce_max_seconds must be a number above 0, at most {10 * MAX_DEBOUNCE}"
        )
    key = spec.debounce_key
    if key is not None and not (
        isinstance(key, str) and 0 < len(key) <= MAX_PARTITION_KEY and "\x00" not in key
    ):
        raise InvalidJob(
            f"debounce_key must be a string of 1 to {MAX_PARTITION_KEY} characters, no NUL"
        )
    for name in ("run_at", "delay_seconds", "unique_for"):
        if getattr(spec, name) is not None:
            raise InvalidJob(f"a debounced submit takes no {name}: its start is the debounce's")
    return Debounce(float(seconds), float(most), key)


def spec_hash(spec: JobSpec) -> str:
    """The request an idempotency key is checked against. The job features' options take part
    only when given, so the hashes of requests without them are unchanged."""
    body: dict[str, Any] = {
        "type": spec.type,
        "payload": spec.payload or {},
        "priority": parse_priority(spec.priority),
        "max_retries": spec.max_retries,
        "timeout_seconds": spec.timeout_seconds,
        "run_at": spec.run_at.isoformat() if spec.run_at else None,
        "delay_seconds": spec.delay_seconds,
    }
    for name in ("meta", "unique_for", "unique_key", "partition_key"):
        if (value := getattr(spec, name)) is not None:
            body[name] = value
    return request_digest(body)


def request_digest(request: Any) -> str:
    """What an idempotency key is checked against, for a job, a batch and a workflow alike: the
    SHA-256 of the request as JSON with sorted keys."""
    return hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).hexdigest()


def check_replay(stored: str | None, digest: str, conflict: str) -> None:
    """A second submit with an idempotency key is a replay only with the first one's request:
    raises ``IdempotencyConflict(conflict)`` otherwise."""
    if stored != digest:
        raise IdempotencyConflict(conflict)


def unique_key_for(
    job_type: str,
    payload: Mapping[str, Any],
    unique_for: float | None,
    unique_key: str | None,
) -> str | None:
    """The key stored in ``job_uniques``, scoped by job type: ``<type>/key/<unique_key>``, or
    by default ``<type>/payload/<SHA-256 of the payload as JSON with sorted keys>`` (so
    ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` are the same job). None without
    ``unique_for``."""
    if unique_for is None:
        if unique_key is not None:
            raise InvalidJob("unique_key needs unique_for (the seconds the key is held)")
        return None
    if not (
        _is_number(unique_for) and math.isfinite(unique_for) and 0 < unique_for <= MAX_UNIQUE_FOR
    ):
        raise InvalidJob(
            f"unique_for must be a number of seconds above 0, at most {MAX_UNIQUE_FOR}"
        )
    if unique_key is not None:
        if not isinstance(unique_key, str) or not 0 < len(unique_key) <= MAX_UNIQUE_KEY:
            raise InvalidJob("unique_key must be a string of 1 to 255 characters")
        if "\x00" in unique_key:
            raise InvalidJob("unique_key must not contain NUL characters")
        return f"{job_type}/key/{unique_key}"
    canonical = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return f"{job_type}/payload/{hashlib.sha256(canonical).hexdigest()}"


async def replayed(store: Store, conn: Connection, row: NewJob, conflict: str) -> JobRow:
    """The job an earlier submit with ``row``'s idempotency key created, when that submit had
    the same request hash (a replay); else ``IdempotencyConflict(conflict)``."""
    assert row.idempotency_key is not None
    existing = await store.job_get_by_idempotency_key(conn, row.idempotency_key)
    if existing is None:
        raise IdempotencyConflict(conflict)
    assert row.request_hash is not None
    check_replay(existing.request_hash, row.request_hash, conflict)
    return existing


# Non-finite numbers: orjson writes NaN and the infinities as null, so a value holding one would
# be stored as another value than the one given; every path from Python refuses them with the
# same words (the API refuses them in a body, api/body.py).
def non_finite(value: Any, path: str) -> str | None:
    """Where ``value`` holds NaN or an infinity: "numbers must be finite (nan at
    payload.scores[1])"; None when it holds none. Callers look only when the JSON they encoded
    holds a ``null``, so a clean value pays one ``bytes`` search."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"numbers must be finite ({value} at {path})"
    if isinstance(value, Mapping):
        items: Any = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f"{path}.{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    else:
        return None
    return next((w for p, v in items if (w := non_finite(v, p)) is not None), None)


def check_finite(value: Any, encoded: bytes, path: str) -> str | None:
    """``non_finite`` for a value already encoded as ``encoded`` (skipped when no ``null``)."""
    return non_finite(value, path) if b"null" in encoded else None
