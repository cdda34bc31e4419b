"""Guarantee 8 (and 3): duplicate deliveries and poison messages never run a job twice to
completion, never crash or wedge a worker; malformed messages end in the dead-letter queue."""

from __future__ import annotations

import itertools
import uuid

import orjson

from conveyor import enqueue
from conveyor.core.config import Settings
from conveyor.worker import Worker

from .. import db as tdb
from .apps import ghost_router, router
from .checker import Ledger, check
from .harness import drain, publish_raw, running, topology, wait_until

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
        assert all(not w.status().dead_parts for w in stack.workers)
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
        assert not worker.status().dead_parts, "a worker loop died"
        rejected = sum(
            s.value
            for m in worker.metrics.messages_rejected.collect()
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


# The failure this guards against: the worker's claim (store.JOB_CLAIM_MANY) does not
# filter by job type, so a worker claims any job whose id arrives in its queues, even of a type it
# has no handler for; the attempt fails with LookupError and burns a retry (FAILED at once with
# max_retries=0) instead of leaving the job to a worker of its type


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
            fsettings.amqp_url,
            top.exchange,
            "work",
            [orjson.dumps({"id": job_id, "type": "ghost"})],
        )
        worker = stack.workers[0]

        def dropped() -> float:
            return sum(
                s.value
                for m in worker.metrics.messages_dropped.collect()
                for s in m.samples
                if s.name.endswith("_total")
            )

        await wait_until(lambda: dropped() >= 1, timeout=15, what="the misrouted message dropped")
        body = (await stack.client.get(f"/jobs/{job_id}")).json()
        print(f"[faults] misrouted ghost job once a work-only worker dropped its message: "
              f"status={body['status']} attempts={body['attempts']} "
              f"last_error={(body['last_error'] or '')[:80]!r}")  # fmt: skip
        assert (body["status"], body["attempts"]) == ("PENDING", 0), body
        await stack.add_worker(ghost_router, types=["ghost"], concurrency=2)
        v = await check(fsettings.database_url, stack.accepted, ledger, label="misrouted-type")
    v.assert_clean()


class FakeDelivery:
    """Just enough of an ``AbstractIncomingMessage`` for ``Worker.process_batch``."""

    _tags = itertools.count(1_000_000)

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.routing_key = "work"
        self.message_id: str | None = None
        self.delivery_tag = next(self._tags)
        self.channel = None
        self.acks = 0
        self.rejects = 0

    async def ack(self, multiple: bool = False) -> None:
        self.acks += 1

    async def reject(self, requeue: bool = False) -> None:
        self.rejects += 1

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        self.rejects += 1


# The failure this guards against: Worker.process_batch drops a duplicate of a job that
# is claimed in the same batch without a log line or a metric (_explain_dropped only sees ids that
# did not start), against guarantee 8


async def test_duplicates_within_one_batch_are_counted(fsettings: Settings, ledger: Ledger) -> None:
    """Three deliveries of one PENDING job reach the claim together: one runs, two are
    acknowledged as duplicates — and counted as such."""
    conn = await tdb.connect(fsettings.database_url)
    try:
        async with conn.transaction():
            job_id = await enqueue(conn, "work", {"ledger": str(ledger)})
            # as if relayed already: the deliveries below stand for its message
            await conn.execute("DELETE FROM job_outbox WHERE job_id = $1", job_id)
    finally:
        await conn.close()
    worker = Worker(fsettings, router, concurrency=4)
    await worker.start()
    try:
        copies = [FakeDelivery(orjson.dumps({"id": str(job_id), "type": "work"})) for _ in range(3)]
        for _ in copies:
            await worker.slots.acquire()
        await worker.process_batch(copies)  # type: ignore[arg-type]
        v = await check(fsettings.database_url, [job_id], ledger, label="in-batch-duplicates")
    finally:
        await worker.stop(grace=2)
    dropped = sum(
        s.value
        for m in worker.metrics.messages_dropped.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )
    v.extra["dropped_metric"] = int(dropped)
    print(f"[faults] in-batch duplicates: acks={[c.acks for c in copies]} metric={int(dropped)}")
    v.assert_clean()
    assert [c.acks for c in copies] == [1, 1, 1]
    assert v.executed == 1
    assert dropped == 2, f"2 duplicate deliveries dropped, the metric says {int(dropped)}"
