"""Guarantees 2 and 3 when the publisher dies between RabbitMQ's confirm and the outbox delete:
the rows stay, are published again (duplicates appear), and every job still completes exactly
once in PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from conveyor.core.config import Settings

from .apps import router
from .checker import Ledger, check
from .harness import Proc, component_env, running
from .relay_faults import after_confirm


class InjectedCrash(RuntimeError):
    pass


def _total(counter: object) -> int:
    return int(
        sum(
            s.value
            for m in counter.collect()  # type: ignore[attr-defined]
            for s in m.samples
            if s.name.endswith("_total")
        )
    )


async def test_relay_fails_between_confirm_and_delete(fsettings: Settings, ledger: Ledger) -> None:
    """A fault injected from outside raises after the confirms of about half the batches (the
    transaction holding the claimed outbox rows rolls back): published rows are published
    again."""
    rng = random.Random(7)
    crashes = 0
    published = 0  # confirmed publishes, including those of batches that crashed afterwards

    async def crash(results: Sequence[BaseException | None]) -> None:
        nonlocal crashes, published
        published += sum(1 for r in results if r is None)
        if crashes < 15 and rng.random() < 0.5:
            crashes += 1
            raise InjectedCrash("publisher crashed between confirm and outbox delete")

    async with running(fsettings, routers=[router], concurrency=16,
                       relay_setup=lambda r: after_confirm(r, crash)) as stack:  # fmt: skip
        await stack.submit_many(
            150, "work", lambda i: {"ledger": str(ledger), "sleep": 0.05}, parallel=10, pace=0.05
        )
        v = await check(fsettings.database_url, stack.accepted, ledger, label="relay-crash")
        dropped = _total(stack.workers[0].metrics.messages_dropped)
    v.extra.update(crashes=crashes, published=published, duplicates_published=published - 150,
                   dropped_by_worker=dropped)  # fmt: skip
    print(f"[faults] relay crash after confirm: {crashes} crashes, {published} publishes for "
          f"150 jobs, worker dropped {dropped} duplicates")  # fmt: skip
    v.assert_clean()
    assert crashes > 0
    assert published > 150, "no duplicate was published: the fault did not bite"
    assert v.executed == 150 and v.duplicates_executed == 0


@pytest.mark.timeout(180)
async def test_publisher_process_dies_between_confirm_and_delete(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """A real publisher process ``os._exit``s after confirms (p=0.5, at most 6 times), and is
    restarted each time, like a crash-looping pod."""
    max_crashes = 6
    crashes = 0
    stop = asyncio.Event()

    def publisher(p: float) -> Proc:
        env = component_env(fsettings, FAULTS_CRASH_P=str(p))
        return Proc("crashing-publisher", [sys.executable, "-m", "tests.faults.crashing_publisher"],
                    env, tmp_path).start()  # fmt: skip

    async def supervise() -> None:
        nonlocal crashes, proc
        while not stop.is_set():
            if not proc.alive():
                assert proc.popen is not None
                assert proc.popen.returncode == 3, proc.log()[-2000:]
                crashes += 1
                proc = publisher(0.5 if crashes < max_crashes else 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    proc = publisher(0.5)
    async with running(fsettings, routers=[router], concurrency=16, relays=0) as stack:
        sup = asyncio.create_task(supervise())
        await stack.submit_many(
            120, "work", lambda i: {"ledger": str(ledger), "sleep": 0.05}, parallel=10, pace=0.2
        )
        v = await check(fsettings.database_url, stack.accepted, ledger, label="publisher-os-exit",
                        timeout=90)  # fmt: skip
        stop.set()
        await sup
        dropped = _total(stack.workers[0].metrics.messages_dropped)
        await proc.stop()
    v.extra.update(publisher_crashes=crashes, dropped_by_worker=dropped)
    print(f"[faults] publisher process: {crashes} crashes after confirm; worker dropped "
          f"{dropped} duplicate deliveries")  # fmt: skip
    v.assert_clean()
    assert crashes >= 1
    assert dropped > 0, "no duplicate delivery observed: the fault did not bite"
    assert v.executed == 120 and v.duplicates_executed == 0
