"""Raw SQL in tests: connections whose ``search_path`` starts with Conveyor's schema, so a test
can write ``SELECT … FROM jobs``. Product code never relies on ``search_path`` (every store
statement names the schema); only tests take this shortcut."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from conveyor.store.schema import DEFAULT_SCHEMA

SCHEMA = DEFAULT_SCHEMA


def as_role(url: str, role: str) -> str:
    """``url`` logging in as ``role`` instead (trust auth: no password)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}"))


async def connect(url: str, *, schema: str = SCHEMA, **kwargs: Any) -> asyncpg.Connection:
    settings = {**kwargs.pop("server_settings", {}), "search_path": f"{schema}, public"}
    return await asyncpg.connect(url, server_settings=settings, **kwargs)


# Types the tests submit through the API or ``enqueue()`` before (or without) a worker for them:
# registered in every test database, as a deploy step would (``conveyor types register``).
AD_HOC_TYPES = (
    "t", "work", "a", "b", "c", "x", "m", "ok", "send_email", "alpha", "beta", "gamma", "delta",
    "eps", "lost", "deep", "kind_a", "kind_b", "hello", "charge", "resize_image",
    "poll_upstream", "sync_work",
    # broker tests (test_relay, test_sweeper_broker, test_retry_pens, test_deadletters)
    "broken", "fine", "pens", "held", "vanished", "twice", "later", "hour", "doomed",
)  # fmt: skip


async def register_test_types(url: str, *, schema: str = SCHEMA) -> None:
    """Register the job types of the tests' routers and ``AD_HOC_TYPES`` in ``schema``."""
    from conveyor import JobRouter
    from conveyor.jobs.types import register_router_types

    from . import apps
    from .faults import apps as fault_apps
    from .integration import worker_apps

    ad_hoc = JobRouter()
    for name in AD_HOC_TYPES:
        ad_hoc.job(name)(_noop)
    conn = await asyncpg.connect(url)
    try:
        for router in (apps.router, fault_apps.ghost_router, worker_apps.router, ad_hoc):
            await register_router_types(conn, router, schema=schema)
    finally:
        await conn.close()


async def _noop(job: object) -> None:
    return None
