"""Deciding what becomes of an attempt: pure functions, tested table-driven.

The ack point: a delivery stays unacknowledged while its job runs and is acknowledged once the
attempt's outcome has committed, so prefetch bounds the work in hand and KEDA's HTTP-mode
trigger sees running jobs as unacked messages. A job that runs longer than
``CONVEYOR_EARLY_ACK_AFTER`` (10 min, well under RabbitMQ's 30 min ``consumer_timeout``) has its
delivery acknowledged early; from the claim on, the lease in PostgreSQL is the reservation either
way: a dead worker's job comes back when its lease expires (the sweeper re-publishes it).
"""

from __future__ import annotations

import random
import re
import traceback
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from ..core.errors import Retry
from ..core.jobs import backoff_delay, snap_to_pen
from ..jobs import spec
from ..jobs.router import HandlerSpec

MAX_ERROR_CHARS = 4000
CUT = "\n[...]\n"  # marks the middle of an error text cut to MAX_ERROR_CHARS
# ``Retry(delay)`` below this waits this long: a handler that always raises ``Retry(0)`` must not
# become a hot loop through the outbox and the broker. One second is the shortest holding pen.
RETRY_FLOOR_SECONDS = 1


class Kind(Enum):
    COMPLETE = "complete"
    FAIL = "fail"  # RETRYING (delay set) or FAILED (delay None)
    RELEASE = "release"  # hand back without consuming a retry (shutdown)


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    result_json: str | None = None
    error: str | None = None
    delay: int | None = None
    consume: bool = True

    @property
    def label(self) -> str:
        """The attempt's outcome as ``conveyor_jobs_finished_total``'s ``outcome`` label; a
        ``Retry`` snooze (a later run asked for, no retry consumed) is no failure: ``snoozed``."""
        if self.kind is Kind.FAIL:
            if self.delay is None:
                return "failed"
            return "retry" if self.consume else "snoozed"
        return "completed" if self.kind is Kind.COMPLETE else "released"


def clean_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Text PostgreSQL accepts: no NUL characters, no lone surrogates, at most ``limit``
    characters. The one place an error text is cleaned and cut, once per text: a longer text
    keeps its start (the exception's message) and its end (a traceback's innermost frames)."""
    text = text.replace("\x00", "")
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) <= limit:
        return text
    half = (limit - len(CUT)) // 2
    return text[:half] + CUT + text[len(text) - (limit - len(CUT) - half) :]


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<the exception's str() failed>"


def completed(result: Any, *, max_bytes: int | None = None) -> Outcome:
    """The attempt returned ``result``: COMPLETED with it, or FAILED at once (no retry: the
    same code returns the same kind of value) when it is not JSON-serialisable or its JSON is
    over ``max_bytes`` (``CONVEYOR_MAX_RESULT_BYTES``). Encoded on the event loop: orjson
    holds the GIL while it encodes, so a thread would not let the loop run meanwhile."""
    if result is None:
        return Outcome(Kind.COMPLETE, None)
    try:
        data = orjson.dumps(result, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        return Outcome(Kind.FAIL, error=clean_text(f"result is not JSON-serialisable: {exc}"))
    if b"null" in data and (where := non_finite(result)) is not None:
        return Outcome(Kind.FAIL, error=clean_text(f"result is not JSON: {where}"))
    if max_bytes is not None and len(data) > max_bytes:
        return Outcome(Kind.FAIL, error=too_large(len(data), max_bytes))
    return Outcome(Kind.COMPLETE, data.decode())


def non_finite(value: Any, path: str = "result") -> str | None:
    """Where a result holds NaN or an infinity (``jobs.spec.non_finite``)."""
    return spec.non_finite(value, path)


def too_large(size: int, cap: int) -> str:
    return f"result too large ({size} bytes > {cap}, CONVEYOR_MAX_RESULT_BYTES)"


def describe(exc: BaseException) -> str:
    """The exception's name and message, then its traceback; never raises, even when the
    exception's ``__str__`` does. Not cut here: ``failure`` cleans and cuts it once."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        text = ""
    head = f"{type(exc).__name__}: {_safe_str(exc)}"
    return head + "\n" + text if head not in text[:200] else text


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$', re.M)


def raised_at(error: str) -> str | None:
    """Where a stored error (``describe``'s text) was raised: its innermost frame as
    ``file:line in function``; None for an error without a traceback."""
    frames = _FRAME.findall(error)
    if not frames:
        return None
    file, line, function = frames[-1]
    return f"{file}:{line} in {function}"


def failed(
    exc: BaseException,
    *,
    retry_count: int,
    max_retries: int,
    spec: HandlerSpec | None,
    rng: random.Random | None = None,
) -> Outcome:
    """An exception from attempt → RETRYING after a delay, or FAILED when retries are used up.

    ``Retry(delay)`` asks for another attempt without consuming a retry; any other exception
    consumes one.
    """
    if isinstance(exc, Retry):
        delay = snap_to_pen(max(exc.delay, RETRY_FLOOR_SECONDS))
        return Outcome(
            Kind.FAIL, error=clean_text(f"Retry: {exc.reason}"), delay=delay, consume=False
        )
    return failure(
        describe(exc), retry_count=retry_count, max_retries=max_retries, spec=spec, rng=rng
    )


def failure(
    error: str,
    *,
    retry_count: int,
    max_retries: int,
    spec: HandlerSpec | None,
    rng: random.Random | None = None,
) -> Outcome:
    error = clean_text(error)
    if retry_count >= max_retries:
        return Outcome(Kind.FAIL, error=error, delay=None)
    delays = spec.retry_delays if spec else None
    return Outcome(Kind.FAIL, error=error, delay=backoff_delay(retry_count + 1, delays, rng=rng))


RELEASE = Outcome(Kind.RELEASE)
