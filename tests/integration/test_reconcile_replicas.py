"""Several sweeper replicas reconciling at once. Each computes the same shortfall
(overdue jobs minus ready messages); without coordination a second replica re-publishes on top
of what the first just re-published, so duplicates grow with the number of replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from conveyor import JobSpec, enqueue_many
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper
from conveyor.store import Store


class _BeforeRepublish:
    """The store, with a hook run just before ``job_republish_overdue`` (the moment another
    replica can interleave)."""

    def __init__(self, store: Store, hook: Callable[[], Awaitable[Any]]) -> None:
        self._store = store
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def job_republish_overdue(self, *args: Any, **kwargs: Any) -> int:
        await self._hook()
        return await self._store.job_republish_overdue(*args, **kwargs)


@pytest.fixture
async def replicas(settings: Settings) -> AsyncIterator[tuple[Sweeper, Sweeper]]:
    pair = [Sweeper(settings.model_copy(update={"reconcile_after": 30})) for _ in range(2)]
    for s in pair:
        await s.start()
    yield pair[0], pair[1]
    for s in pair:
        await s.close()


def _depth(n: int) -> Callable[[str], Awaitable[int]]:
    async def depth(_: str) -> int:
        return n

    return depth


async def test_two_replicas_republish_only_the_shortfall(
    db: asyncpg.Connection, replicas: tuple[Sweeper, Sweeper]
) -> None:
    a, b = replicas
    await enqueue_many(db, [JobSpec("lost") for _ in range(10)])
    await db.execute("DELETE FROM job_outbox")
    await db.execute("UPDATE jobs SET updated_at = now() - interval '31 s'")
    # 7 messages still sit in the queue: 3 are missing. Replica B runs a whole reconcile at the
    # moment replica A has counted and is about to re-publish.
    # a first pass of each marks the 3 missing as suspects (nothing re-published yet)
    assert await a.reconcile(queue_depth=_depth(7)) == 0
    assert await b.reconcile(queue_depth=_depth(7)) == 0
    b_done: list[int] = []

    async def b_runs() -> None:
        if not b_done:
            b_done.append(await b.reconcile(queue_depth=_depth(7)))

    a.store = _BeforeRepublish(a.store, b_runs)  # type: ignore[assignment]
    a_done = await a.reconcile(queue_depth=_depth(7))
    republished = await db.fetchval("SELECT count(*) FROM job_outbox")
    assert republished == a_done + sum(b_done)
    assert republished == 3, f"{republished} re-published for 3 missing (A {a_done}, B {b_done})"
    assert b_done == [0], "B re-published while A held the type's reconcile lock"
