"""Job vocabulary: statuses, priorities, type names, backoff. Pure functions, no I/O."""

from __future__ import annotations

import bisect
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, TypedDict

from .errors import InvalidJob


class Status(StrEnum):
    WAITING = "WAITING"  # a workflow job whose dependencies are not all met: no message yet
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    IN_PROGRESS = "IN_PROGRESS"
    RETRYING = "RETRYING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class JobOptions(TypedDict, total=False):
    """The options of a submitted job, the same for ``enqueue()``, ``enqueue_sync.enqueue()``,
    ``Workflow.add()`` and a handler's ``job.enqueue()`` (and the fields of ``POST /jobs``)."""

    priority: int | str | None  # 0-9, or "low" / "normal" / "high" (default normal, 5)
    max_retries: int | None  # default: the handler's, else CONVEYOR_MAX_RETRIES
    timeout_seconds: float | None  # default: the handler's
    run_at: datetime | None  # due then (timezone-aware); or delay_seconds, not both
    delay_seconds: float | None
    idempotency_key: str | None  # the same key with the same arguments: the same job
    meta: Mapping[str, Any] | None  # at most 8 KiB of JSON, handed to handlers
    unique_for: float | None  # seconds a second submit of the same job returns this one
    unique_key: str | None  # default: type + canonical payload
    partition_key: str | None  # 1-200 characters; default: the type's partition_by fields
    # while a job of this debounce key waits, a submit replaces its payload and moves its start
    debounce_seconds: float | None  # the start: this long after the last submit ...
    debounce_max_seconds: float | None  # ... at most this long after the first (default 10x)
    debounce_key: str | None  # default: the partition key, else the type


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
CANCELLABLE = frozenset({Status.WAITING, Status.PENDING, Status.SCHEDULED, Status.RETRYING})
REDRIVABLE = frozenset({Status.FAILED, Status.CANCELLED})

# Every status change the system makes, and who makes it. Tests walk this table.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    # released by its last dependency (workflows), or admitted (a limited type); cancelled by a
    # failed dependency or by an operator
    Status.WAITING: frozenset({Status.PENDING, Status.SCHEDULED, Status.CANCELLED}),
    Status.SCHEDULED: frozenset({Status.PENDING, Status.CANCELLED}),
    Status.PENDING: frozenset({Status.IN_PROGRESS, Status.CANCELLED}),
    # a limited type's retry, lease recovery or hand-back waits for admission again (WAITING)
    Status.IN_PROGRESS: frozenset(
        {
            Status.COMPLETED,
            Status.RETRYING,
            Status.FAILED,
            Status.CANCELLED,
            Status.PENDING,
            Status.WAITING,
        }
    ),
    Status.RETRYING: frozenset({Status.IN_PROGRESS, Status.CANCELLED}),
    Status.COMPLETED: frozenset(),
    # redrive; an ordered type's failed head cancelled by an operator (its key goes on)
    Status.FAILED: frozenset({Status.PENDING, Status.WAITING, Status.CANCELLED}),
    # redrive; a cancelled job that never ran keeps its future run_at (SCHEDULED); a workflow
    # job whose dependencies are unmet waits again (WAITING)
    Status.CANCELLED: frozenset({Status.PENDING, Status.SCHEDULED, Status.WAITING}),
}

PRIORITY_NAMES = {"high": 9, "normal": 5, "low": 1}
MIN_PRIORITY, MAX_PRIORITY = 0, 9
DEFAULT_PRIORITY = 5
# Job types, and schedule names: a schedule declared on a handler is named after its type.
TYPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
_TYPE_RE = re.compile(TYPE_PATTERN)


def parse_priority(value: int | str | None) -> int:
    """``"high"``/``"normal"``/``"low"`` or an integer 0-9 → the AMQP priority."""
    if value is None:
        return DEFAULT_PRIORITY
    if isinstance(value, bool):
        raise InvalidJob("priority must be 'high', 'normal', 'low' or an integer 0-9")
    if isinstance(value, int):
        if MIN_PRIORITY <= value <= MAX_PRIORITY:
            return value
        raise InvalidJob(f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}")
    if isinstance(value, str) and value in PRIORITY_NAMES:
        return PRIORITY_NAMES[value]
    raise InvalidJob("priority must be 'high', 'normal', 'low' or an integer 0-9")


def is_name(value: object) -> bool:
    """``value`` is a valid job type or schedule name (``TYPE_PATTERN``)."""
    return isinstance(value, str) and _TYPE_RE.fullmatch(value) is not None


def check_type(job_type: str) -> str:
    if not is_name(job_type):
        raise InvalidJob(f"job type must match {TYPE_PATTERN}")
    return job_type


# Random bits for job ids, drawn from os.urandom 256 ids at a time (one system call per id would be
# half of new_job_id's cost); per thread, and dropped in a forked child, which must never hand
# out its parent's bits.
_IDS_PER_DRAW = 256
_random = threading.local()
os.register_at_fork(after_in_child=lambda: _random.__dict__.clear())
_new, _set, _UUID, _UNKNOWN = object.__new__, object.__setattr__, uuid.UUID, uuid.SafeUUID.unknown


def _random_bits() -> int:
    """80 random bits, from this thread's pool of ``os.urandom`` bytes."""
    pool: list[int] = _random.__dict__.setdefault("pool", [])
    if not pool:
        raw = os.urandom(10 * _IDS_PER_DRAW)
        pool.extend(int.from_bytes(raw[i : i + 10], "big") for i in range(0, len(raw), 10))
    return pool.pop()


def new_job_id() -> uuid.UUID:
    """A UUIDv7: time-ordered, so new rows land at the right edge of the primary key index."""
    ms = time.time_ns() // 1_000_000
    rand = _random_bits()
    rand_a = (rand >> 62) & 0xFFF
    rand_b = rand & 0x3FFF_FFFF_FFFF_FFFF
    value = ((ms & 0xFFFF_FFFF_FFFF) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    # uuid.UUID(int=value) without its argument checks (value is a valid 128-bit UUIDv7)
    job_id = _new(_UUID)
    _set(job_id, "int", value)
    _set(job_id, "is_safe", _UNKNOWN)
    return job_id


# ---------------------------------------------------------------- retry delays and holding pens
#
# Every distinct retry delay is a durable holding-pen queue with a fixed TTL, so delays must come
# from a bounded set. Handler-configured ``retry_delays`` are used exactly; the default
# exponential backoff and ``Retry(delay=...)`` snap to this ladder of pens.
PEN_LADDER: tuple[int, ...] = (
    *(1, 2, 3, 5, 7, 10, 15, 20, 30, 45),  # seconds
    *(60, 90, 120, 180, 300, 450, 600, 900, 1200, 1800, 2700),  # 1 to 45 minutes
    *(3600, 5400, 7200, 10800, 21600),  # 1 to 6 hours
)


def snap_to_pen(delay: float) -> int:
    """The smallest pen delay >= ``delay`` (0 stays 0: no pen, straight back to the queue)."""
    if delay <= 0:
        return 0
    i = bisect.bisect_left(PEN_LADDER, delay)
    return PEN_LADDER[min(i, len(PEN_LADDER) - 1)]


def backoff_delay(
    retry_number: int,
    retry_delays: Sequence[float] | None = None,
    *,
    rng: random.Random | None = None,
) -> int:
    """Seconds before retry number ``retry_number`` (1-based).

    With ``retry_delays`` the n-th entry is used (the last one repeats). Without, the delay grows
    exponentially (2, 4, 8, ... seconds, capped at one hour) with "equal jitter": a random point
    in the upper half of the interval, snapped to the pen ladder.
    """
    if retry_number < 1:
        raise ValueError("retry_number is 1-based")
    if retry_delays:
        return max(0, round(retry_delays[min(retry_number, len(retry_delays)) - 1]))
    ceiling = min(2.0**retry_number, 3600.0)
    r = rng or random
    return snap_to_pen(r.uniform(ceiling / 2, ceiling))


def pen_name_suffix(delay: int) -> str:
    """``5`` → ``5s``, ``300`` → ``5m``, ``3600`` → ``1h``."""
    if delay % 3600 == 0:
        return f"{delay // 3600}h"
    if delay % 60 == 0:
        return f"{delay // 60}m"
    return f"{delay}s"
