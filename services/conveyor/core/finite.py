"""Non-finite numbers in values Conveyor writes as JSON. orjson writes NaN and the infinities as
``null``, so a payload, meta, schedule payload or result holding one would be stored as another
value than the one given; the API refuses them in a body (``api/body.py``), and every path from
Python refuses them with the same words."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


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
