"""Bounded job types: how a type becomes known, and what happens to the others.

A type is known once a worker that handles it has started (``Worker.start`` registers its types
with their handlers' defaults in the ``job_types`` table), or once a deploy step registered a
router's types without running a worker (``register_router_types``, ``conveyor types register
--app``). The API and ``enqueue()`` reject any other type with ``UnknownJobType`` (422 naming
the known types), unless ``CONVEYOR_ACCEPT_UNKNOWN_TYPES=true``: then queues, job rows and metric
series stay bounded by what operators deploy, not by what clients send.

Registering a router also upserts the schedules declared on its handlers (``schedule=`` /
``every=``), each named after its type (``register_router_schedules``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..core.errors import UnknownJobType
from ..store import Connection, JobTypeDefaults, Store
from ..store.caller import schema_store
from .router import JobRouter
from .schedules import build_schedule


def router_types(router: JobRouter, types: Iterable[str] | None = None) -> list[JobTypeDefaults]:
    """The registration rows of ``router``'s handlers (all of them, or only ``types``)."""
    wanted = set(types) if types is not None else None
    out = []
    for name, spec in sorted(router.handlers.items()):
        if wanted is not None and name not in wanted:
            continue
        delays = tuple(round(d) for d in spec.retry_delays) if spec.retry_delays else None
        rate = spec.rate
        out.append(
            JobTypeDefaults(
                name,
                spec.max_retries,
                spec.timeout,
                delays,
                spec.concurrency,
                rate.limit if rate else None,
                rate.period if rate else None,
                spec.partition,
            )
        )
    return out


async def register_router_types(
    conn: Connection,
    router: JobRouter,
    types: Iterable[str] | None = None,
    *,
    schema: str | None = None,
) -> None:
    """Register ``router``'s types (or only ``types``) without running a worker: a deploy step,
    or a test that submits before its worker starts. Joins the caller's transaction."""
    store = schema_store(schema)
    await store.job_type_register_many(conn, router_types(router, types))
    await register_router_schedules(conn, router, types, store=store)


async def register_router_schedules(
    conn: Connection,
    router: JobRouter,
    types: Iterable[str] | None = None,
    *,
    store: Store | None = None,
    schema: str | None = None,
) -> list[str]:
    """Upsert the schedules declared on ``router``'s handlers (``schedule=`` / ``every=``),
    each named after its type. A schedule paused by an operator stays paused; one created
    through the API under the same name is left alone. Returns the names registered."""
    store = store or schema_store(schema)
    names = []
    wanted = set(types) if types is not None else None
    now = await store.db_clock(conn)
    for job_type, timed in sorted(router.schedules.items()):
        if wanted is not None and job_type not in wanted:
            continue
        rule = timed.rule
        new = build_schedule(
            job_type,
            job_type,
            cron=rule.cron,
            every_seconds=rule.every,
            timezone=rule.timezone,
            catch_up=timed.catch_up,
            source="code",
            now=now,
        )
        if await store.schedule_upsert(conn, new) is not None:
            names.append(job_type)
    return names


class KnownTypes:
    """The known types, cached for ``ttl`` seconds. A type missing from the cache is looked up
    again before it is rejected, so a worker that just registered is accepted at once."""

    def __init__(
        self, store: Store, *, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self._names: frozenset[str] = frozenset()
        self._read_at = float("-inf")

    async def check(self, conn: Connection, types: Iterable[str]) -> None:
        """Raise ``UnknownJobType`` for the first type nobody registered."""
        wanted = set(types)
        if self.clock() - self._read_at <= self.ttl and wanted <= self._names:
            return
        self._names = await self.store.job_type_names(conn)
        self._read_at = self.clock()
        missing = sorted(wanted - self._names)
        if missing:
            raise UnknownJobType(missing[0], sorted(self._names))


_ENQUEUE_CACHES: dict[tuple[str, str, str], KnownTypes] = {}


def _database_of(conn: Any) -> tuple[str, str] | None:
    """(server address, database) of an asyncpg connection, to key the cache: an application
    may enqueue into several databases."""
    addr, params = getattr(conn, "_addr", None), getattr(conn, "_params", None)
    database = getattr(params, "database", None)
    return None if addr is None or database is None else (str(addr), str(database))


async def check_for_enqueue(conn: Connection, store: Store, types: Iterable[str]) -> None:
    """``enqueue()``'s policy: the same as the API's; ``CONVEYOR_ACCEPT_UNKNOWN_TYPES`` read from
    the application's environment."""
    if os.environ.get("CONVEYOR_ACCEPT_UNKNOWN_TYPES", "").lower() in ("1", "true", "yes", "on"):
        return
    where = _database_of(conn)
    if where is None:  # unknown kind of connection: no cache
        await KnownTypes(store).check(conn, types)
        return
    key = (store.schema, *where)
    known = _ENQUEUE_CACHES.get(key)
    if known is None:
        known = _ENQUEUE_CACHES[key] = KnownTypes(store)
    await known.check(conn, types)
