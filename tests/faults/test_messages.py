"""Guarantee 8 (and 3): duplicate deliveries and poison messages never run a job twice to
completion, never crash or wedge a worker; malformed messages end in the dead-letter queue."""

from __future__ import annotations

import asyncio
import uuid

import orjson

from conveyor.core.config import Settings

from .apps import ghost_router, router
from .checker import Ledger, check
from .harness import drain, publish_raw, running, topology

COPIES = 5


async def test_duplicate_deliveries_complete_once(fsettings: Settings, ledger: Ledger) -> None:
    """Every job's message is published ``COPIES`` more times straight to the exchange, while
    two workers race for them: each job runs once and completes once."""
    top = topology(fsettings)
    async with running(fsettings, routers=[router, router], concurrency=8) as stack:
        ids = await stack.submit_many(
            60, "work", lambda i: {"ledger": str(ledger), "sleep": 0.2}, parallel=30
        )
        bodies = [orjson.dumps({"id": i, "type": "work"}) for i in ids for _ in range(COPIES)]
        await publish_raw(fsettings.amqp_url, top.exchange, "work", bodies, message_ids=None)
        v = await check(fsettings.database_url, stack.accepted, ledger, label="duplicates")
        dropped = sum(
            s.value
            for w in stack.workers
            for m in w.metrics.messages_dropped.collect()
            for s in m.samples
            if s.name.endswith("_total")
        )
        v.extra["duplicate_messages"] = len(bodies)
        v.extra["dropped_by_workers"] = int(dropped)
        print(f"[faults] duplicates: published {len(bodies)} extra copies; workers dropped "
              f"{int(dropped)}")  # fmt: skip
        assert all(w._tasks and not any(t.done() for t in w._tasks) for w in stack.workers)
    v.assert_clean()
    assert v.executed == len(ids), "a duplicate delivery started a second execution"
    assert v.duplicates_executed == 0
    for job_id in ids:
        assert ledger.count("done", uuid.UUID(job_id)) == 1


async def test_poison_messages_do_not_wedge_the_worker(fsettings: Settings, ledger: Ledger) -> None:
    """Not JSON, not an object, a bad id, an unknown job id (with an unknown type name) and a
    1 MiB body, interleaved with real jobs: the worker keeps running jobs; the malformed ones are
    dead-lettered, the well-formed ones for unknown jobs acknowledged."""
    top = topology(fsettings)
    malformed = [
        b"this is not JSON {",
        b"[1, 2, 3]",
        orjson.dumps({"id": "not-a-uuid", "type": "work"}),
        orjson.dumps({"type": "work"}),
        b'{"id": "' + b"x" * (1024 * 1024) + b'", "type": "work"}',
    ]
    unknown = [
        orjson.dumps({"id": str(uuid.uuid4()), "type": "work"}),
        orjson.dumps({"id": str(uuid.uuid4()), "type": "no_such_type"}),
    ]
    async with running(fsettings, routers=[router], concurrency=4) as stack:
        before = await stack.submit_many(20, "work", lambda i: {"ledger": str(ledger)})
        await publish_raw(fsettings.amqp_url, top.exchange, "work", malformed + unknown)
        after = await stack.submit_many(20, "work", lambda i: {"ledger": str(ledger)})
        v = await check(fsettings.database_url, stack.accepted, ledger, label="poison")
        worker = stack.workers[0]
        assert not any(t.done() for t in worker._tasks), "a worker loop died"
        rejected = sum(
            s.value
            for m in worker.metrics.messages_dead_lettered.collect()
            for s in m.samples
            if s.name.endswith("_total")
        )
        # the worker is still taking work after all of that
        late = await stack.submit("work", {"ledger": str(ledger)})
        await check(fsettings.database_url, [late], ledger, label="poison-after")
    dead = await drain(fsettings.amqp_url, top.dead_letter_queue)
    v.extra["dead_lettered"] = len(dead)
    print(f"[faults] poison: {len(dead)} messages in {top.dead_letter_queue}, worker rejected "
          f"{int(rejected)}")  # fmt: skip
    v.assert_clean()
    assert len(before) + len(after) == 40
    assert sorted(m.body for m in dead) == sorted(malformed)
    assert rejected == len(malformed)


async def test_message_for_a_type_this_worker_lacks_leaves_the_job_alone(
    fsettings: Settings, ledger: Ledger
) -> None:
    """A message naming a real job of type ``ghost`` lands in the ``work`` queue (misrouted,
    e.g. republished by hand). A worker without a ``ghost`` handler must not burn the job's
    attempts on it: once a ``ghost`` worker runs, the job completes on its first attempt."""
    top = topology(fsettings)
    async with running(fsettings, routers=[router], concurrency=4) as stack:
        job_id = await stack.submit("ghost", {"ledger": str(ledger)}, max_retries=0)
        await publish_raw(
            fsettings.amqp_url, top.exchange, "work", [orjson.dumps({"id": job_id, "type": "ghost"})]
        )
        await asyncio.sleep(1.5)
        r = await stack.client.get(f"/jobs/{job_id}")
        print(f"[faults] misrouted ghost job after 1.5 s with a work-only worker: {r.json()}")
        await stack.add_worker(ghost_router, types=["ghost"], concurrency=2)
        v = await check(fsettings.database_url, stack.accepted, ledger, label="misrouted-type")
    v.assert_clean()
