"""Helpers for the security tests: keys per scope, a stack with auth required, requests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from conveyor.cli.keys import create_key
from conveyor.core.config import Settings

from .stack import Stack, running_stack

# for each scope a route may need: a key holding exactly it, and a key holding everything else
# that does not include it (jobs:write includes jobs:read, admin both: no key lacks only
# jobs:read); IMPLIED_BY: a key whose scope includes the needed one (jobs:read's routes are reads,
# so a second request changes nothing)
RIGHT = {"jobs:read": "jobs:read", "jobs:write": "jobs:write", "admin": "admin"}
WRONG = {"jobs:write": "jobs:read", "admin": "jobs:read,jobs:write"}
IMPLIED_BY = {"jobs:read": "jobs:write"}
# well-formed and not: each must be a 401
BAD_KEYS = ["cvk_0123456789ab_" + "A" * 43, "not-a-key", "Bearer", "cvk_"]


def required(settings: Settings, **kw: Any) -> Settings:
    return settings.model_copy(update={"auth": "required", **kw})


async def make_keys(settings: Settings) -> dict[str, str]:
    """scopes (as in RIGHT/WRONG values) → a new key holding them."""
    keys = {}
    for i, scopes in enumerate(sorted({*RIGHT.values(), *WRONG.values(), *IMPLIED_BY.values()})):
        keys[scopes] = await create_key(settings, f"k{i}-{scopes}", scopes)
    return keys


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextlib.asynccontextmanager
async def keyed_stack(settings: Settings, **kw: Any) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    """An API (no publisher, no worker) with auth required, and keys for every scope."""
    s = required(settings, accept_unknown_types=True, **kw)
    keys = await make_keys(s)
    async with running_stack(s, None, maintenance=False, relays=0) as stack:
        yield stack, keys
