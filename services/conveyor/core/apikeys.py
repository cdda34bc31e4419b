"""API keys: format, hashing and scopes (docs/security.md).

A key is ``cvk_<id>_<secret>``: ``id`` is 12 hex characters, public, and finds the key's row;
``secret`` is 32 random bytes (256 bits, URL-safe base64). Only SHA-256 of the whole key is
stored. A fast hash is enough for a key of 256 random bits (nothing to brute-force, unlike a
password), and keeps a cache miss cheap."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable

PREFIX = "cvk_"
SCOPES = ("jobs:read", "jobs:write", "admin")
# admin includes the other two; writing jobs includes reading them (a key that submits must be
# able to wait for its job)
IMPLIED = {"admin": frozenset(SCOPES), "jobs:write": frozenset({"jobs:read", "jobs:write"})}
_KEY = re.compile(r"^cvk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")


def new_key() -> tuple[str, str, bytes]:
    """A fresh key: (key, its public id, its SHA-256)."""
    key_id = secrets.token_hex(6)
    key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return key, key_id, digest(key)


def key_id_of(key: str) -> str | None:
    """The public id of a well-formed key, else None (nothing is looked up for it)."""
    m = _KEY.match(key)
    return m.group(1) if m else None


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_scopes(value: str | Iterable[str]) -> tuple[str, ...]:
    """``"jobs:read,admin"`` → the scopes, checked; raises ValueError naming a bad one."""
    items = value.split(",") if isinstance(value, str) else list(value)
    scopes = sorted({s.strip() for s in items if s.strip()})
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise ValueError(
            f"scopes must be some of {', '.join(SCOPES)}; got {', '.join(bad) or 'none'}"
        )
    return tuple(scopes)


def effective(scopes: Iterable[str]) -> frozenset[str]:
    out: set[str] = set()
    for s in scopes:
        out |= IMPLIED.get(s, frozenset({s}))
    return frozenset(out)
