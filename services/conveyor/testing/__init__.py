"""Helpers for applications' own test suites (``docs/testing.md``): run jobs inline against the
database with no broker (``drain``), assert what was enqueued (``assert_enqueued``,
``refute_enqueued``, ``all_enqueued``), call one handler directly (``run_job``). pytest fixtures
live in ``conveyor.testing.pytest_plugin``."""

from __future__ import annotations

from typing import Any

from ..jobs.router import JobRouter
from ..jobs.types import register_router_types
from ..store.caller import connection_or_pool
from .asserts import Enqueued, JobCall, all_enqueued, assert_enqueued, refute_enqueued, run_job
from .drain import DrainedAttempt, DrainResult, drain


async def register_types(conn: Any, router: JobRouter, *, schema: str | None = None) -> None:
    """Register ``router``'s job types (as a worker does when it starts), so ``enqueue`` accepts
    them before any worker ran."""
    async with connection_or_pool(conn) as raw:
        await register_router_types(raw, router, schema=schema)


__all__ = [
    "DrainResult",
    "DrainedAttempt",
    "Enqueued",
    "JobCall",
    "all_enqueued",
    "assert_enqueued",
    "drain",
    "refute_enqueued",
    "register_types",
    "run_job",
]
