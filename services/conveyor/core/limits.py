"""Limits of a job type and of its partition keys, as pure values: ``rate_limit="100/m"``
parsed and printed, the partition settings checked (admission enforces them:
``store/sql/schema/admission.sql``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_RATE = re.compile(r"^\s*([1-9][0-9]{0,8})\s*/\s*([1-9][0-9]{0,2})?\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_PERIOD = 999 * 86400
# Starts per window, and jobs IN_PROGRESS at once: each admission pass counts a limited type's
# admitted jobs and the starts in its window, so its cost grows with the limit.
MAX_RATE = 100_000
MAX_CONCURRENCY = 10_000


@dataclass(frozen=True, slots=True)
class Rate:
    limit: int  # starts ...
    period: int  # ... per this many seconds

    def __str__(self) -> str:
        for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
            if self.period % seconds == 0:
                n = self.period // seconds
                return f"{self.limit}/{'' if n == 1 else n}{unit}"
        return f"{self.limit}/{self.period}s"


def parse_rate(text: str) -> Rate:
    """``"100/m"`` → 100 starts per 60 s; also ``"5/s"``, ``"1000/h"``, ``"10/30s"``, ``"1/d"``."""
    m = _RATE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"invalid rate limit {text!r}: use N/s, N/m, N/h, N/d or N/<k>s")
    limit, period = int(m.group(1)), int(m.group(2) or 1) * _UNITS[m.group(3)]
    if limit > MAX_RATE:
        raise ValueError(f"a rate limit allows at most {MAX_RATE} starts per window")
    if period > MAX_PERIOD:
        raise ValueError("a rate limit's window is at most 999 days")
    return Rate(limit, period)


def check_concurrency(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CONCURRENCY:
        raise ValueError(
            f"concurrency must be an integer from 1 to {MAX_CONCURRENCY} (or null: no limit)"
        )
    return value


def shares(
    concurrency: int,
    weights: dict[str, int],
    types: Sequence[str],
    *,
    given: dict[str, int] | None = None,
) -> dict[str, int]:
    """Each type's share of a worker's ``concurrency`` in proportion to its weight (a type
    without one weighs 1), at least 1 each, largest remainders first. Empty when no type of
    ``types`` has a weight: then nothing is reserved and the types share the slots freely.
    ``given`` (the operator's ``--weights``) must name only ``types``."""
    unknown = sorted(set(given or {}) - set(types))
    if unknown:
        raise ValueError(f"weights for types this worker does not run: {', '.join(unknown)}")
    if len(types) > concurrency and any(t in weights for t in types):
        raise ValueError("weighted types need --concurrency of at least one slot per type")
    if not any(t in weights for t in types):
        return {}
    w = {t: weights.get(t, 1) for t in types}
    total = sum(w.values())
    exact = {t: concurrency * w[t] / total for t in types}
    out = {t: max(1, int(exact[t])) for t in types}
    left = concurrency - sum(out.values())
    for t in sorted(types, key=lambda t: exact[t] - int(exact[t]), reverse=True):
        if left <= 0:
            break
        out[t] += 1
        left -= 1
    return out


def parse_weights(text: str | None) -> dict[str, int] | None:
    """``"emails=3,reports=1"`` → ``{"emails": 3, "reports": 1}`` (``worker --weights``)."""
    if not text:
        return None
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"invalid weight {part.strip()!r}: use TYPE=N with N >= 1")
        out[name.strip()] = int(value)
    return out


@dataclass(frozen=True, slots=True)
class Partitioning:
    """A type's partition settings (``@router.job(partition_by=..., ...)``): the payload fields
    of the key, and what holds for each key."""

    by: tuple[str, ...] | None = None
    concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: int | None = None
    ordered: str | None = None  # 'hold' or 'continue'


def partitioning(
    by: str | Sequence[str] | None,
    concurrency: int | None,
    rate_limit: str | None,
    ordered: bool | str,
) -> Partitioning | None:
    """The checked settings of ``@router.job``; None when it sets none."""
    fields = (by,) if isinstance(by, str) else tuple(by) if by is not None else None
    if fields is not None and (
        not fields or not all(isinstance(f, str) and 0 < len(f) <= 200 for f in fields)
    ):
        raise ValueError("partition_by must be a payload field name or a tuple of them")
    if ordered is True:
        ordered = "hold"
    if ordered not in (False, "hold", "continue"):
        raise ValueError("ordered must be True, 'hold' or 'continue'")
    rate = parse_rate(rate_limit) if rate_limit is not None else None
    p = Partitioning(
        fields,
        check_concurrency(concurrency),
        rate.limit if rate else None,
        rate.period if rate else None,
        ordered or None,
    )
    return None if p == Partitioning() else p
