"""Submit options of the job features: ``meta`` (a small JSON object handed to handlers) and
unique jobs (``unique_for`` seconds, ``unique_key``). Pure validation, shared by the API and
``enqueue()``; the database enforces uniqueness (``store/unique.py``)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import orjson

from .core.errors import InvalidJob

MAX_META_BYTES = 8 * 1024
MAX_UNIQUE_FOR = 366 * 86400  # a year (and a day)
MAX_UNIQUE_KEY = 255


def encode_meta(meta: Mapping[str, Any] | None) -> str | None:
    """``meta`` as stored (JSON text), None when absent. Raises ``InvalidJob`` (422) for a
    value that is not a JSON object, holds a NUL, or is over 8 KiB of UTF-8."""
    if meta is None:
        return None
    from .core.finite import check_finite
    from .enqueue import _NUL, _POSITIVE_EXPONENT, _plain_floats

    if not isinstance(meta, Mapping):
        raise InvalidJob("meta must be a JSON object")
    try:
        text = orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS)
        if _POSITIVE_EXPONENT.search(text):
            text = orjson.dumps(_plain_floats(meta), option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise InvalidJob(f"meta is not JSON-serialisable: {exc}") from None
    if (where := check_finite(meta, text, "meta")) is not None:
        raise InvalidJob(where)
    if _NUL.search(text):
        raise InvalidJob("meta must not contain NUL characters")
    if len(text) > MAX_META_BYTES:
        raise InvalidJob(f"meta is {len(text)} bytes of UTF-8; the limit is {MAX_META_BYTES}")
    return text.decode()


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
        isinstance(unique_for, int | float)
        and not isinstance(unique_for, bool)
        and math.isfinite(unique_for)
        and 0 < unique_for <= MAX_UNIQUE_FOR
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


def hash_extras(
    meta: Mapping[str, Any] | None, unique_for: float | None, unique_key: str | None
) -> dict[str, Any]:
    """The options that take part in an idempotency key's request hash (only when given, so
    the hashes of requests without them are unchanged)."""
    extras: dict[str, Any] = {}
    if meta is not None:
        extras["meta"] = meta
    if unique_for is not None:
        extras["unique_for"] = unique_for
    if unique_key is not None:
        extras["unique_key"] = unique_key
    return extras
