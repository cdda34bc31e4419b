"""A RabbitMQ cluster loses a node. In ``make test`` (42-67 s there, also beside two busy
loops).

Three private nodes on loopback ports, ``CONVEYOR_QUEUE_TYPE=quorum`` and
``CONVEYOR_AMQP_URL`` listing all three. The API, relay, sweeper and two workers run a few hundred
jobs over four types (one of them high priority, one retried through a holding pen); with a
backlog queued, the node that leads the busiest queue is SIGKILLed. Every type must complete
jobs again within 30 s; then the node is started again and rejoins, and a last wave runs. The
checker: 0 lost, 0 stuck, 0 double-COMPLETED, everything COMPLETED."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor.broker.topology import Topology
from conveyor.core.config import Settings

from .apps import router
from .checker import Ledger, check
from .harness import Stack, fault_settings, running
from .rabbit_cluster import PrivateCluster

TYPES = {"work": {}, "sync_work": {}, "flaky": {}, "work:high": {"priority": "high"}}
RECOVERY_LIMIT = 30.0


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    c = PrivateCluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


async def _wave(stack: Stack, ledger: Ledger, n: int, sleep: float = 0.02) -> dict[str, list[str]]:
    """``n`` jobs of every type, one request each."""
    out: dict[str, list[str]] = {}
    for name, extra in TYPES.items():
        job_type = name.split(":")[0]
        payload = {"ledger": str(ledger), "sleep": sleep}
        out[name] = list(
            await asyncio.gather(*(stack.submit(job_type, payload, **extra) for _ in range(n)))
        )
    return out


async def _first_done(db: Any, probes: dict[str, list[str]], since: float) -> dict[str, float]:
    """Per type, seconds from ``since`` until one of its probes is COMPLETED."""
    took: dict[str, float] = {}
    while len(took) < len(probes) and time.monotonic() - since < 120:
        for name, ids in probes.items():
            if name not in took and await db.fetchval(
                "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[]) AND status = 'COMPLETED'",
                ids,
            ):
                took[name] = round(time.monotonic() - since, 1)
        await asyncio.sleep(0.1)
    return {name: took.get(name, float("inf")) for name in probes}


@pytest.mark.timeout(900)
async def test_a_node_dies_and_every_type_recovers(
    cluster: PrivateCluster, fsettings: Settings, ledger: Ledger
) -> None:
    from .. import db as tdb

    s = fault_settings(fsettings, amqp_url=cluster.amqp_url, queue_type="quorum")
    t = Topology(s.namespace, "quorum")
    figures: dict[str, Any] = {}
    async with running(s, routers=[router, router], concurrency=8) as stack:
        warm = await _wave(stack, ledger, 5)
        await _wait_done(s.database_url, [i for ids in warm.values() for i in ids])
        # a backlog: 300 slower jobs of one type, then the node leading its queue dies
        payload = {"ledger": str(ledger), "sleep": 0.1}
        body = {"jobs": [{"type": "work", "payload": payload}] * 150}
        for _ in range(2):
            r = await stack.client.post("/jobs/batch", json=body)
            assert r.status_code == 201, r.text
            stack.accepted += [j["id"] for j in r.json()["jobs"]]
        await _wave(stack, ledger, 10)
        live = cluster.nodes[0]
        ours = {}
        for _ in range(50):
            ours = {n: q for n, q in cluster.queues(live).items() if n.startswith(s.namespace)}
            if sum(int(q["messages"]) for q in ours.values()) > 50:  # type: ignore[call-overload]
                break
            await asyncio.sleep(0.1)
        busiest = max(ours, key=lambda n: int(ours[n]["messages"]))  # type: ignore[call-overload]
        victim = str(ours[busiest]["leader"])
        assert all(q["type"] == "quorum" for q in ours.values()), ours
        assert {t.work_queue("work"), t.high_queue("work"), t.dead_letter_queue} <= set(ours)
        figures.update(busiest=busiest, backlog=ours[busiest]["messages"], killed=victim)
        killed_at = time.monotonic()
        await asyncio.to_thread(cluster.kill, victim)
        probes = await _wave(stack, ledger, 3)
        db = await tdb.connect(s.database_url)
        try:
            figures["recovered_s"] = await _first_done(db, probes, killed_at)
            late = {k: v for k, v in figures["recovered_s"].items() if v > RECOVERY_LIMIT}
            if late:  # what the late type's probes went through, for the failure message
                figures["late_probes"] = [
                    dict(r)
                    for r in await db.fetch(
                        "SELECT j.id::text, j.status::text, j.attempts, j.updated_at,"
                        " j.run_at, (SELECT count(*) FROM job_outbox o WHERE o.job_id = j.id)"
                        " AS outbox, (SELECT array_agg(a.outcome || ':' || coalesce(a.error, ''))"
                        " FROM job_attempts a WHERE a.job_id = j.id) AS attempts_log"
                        " FROM jobs j WHERE j.id = ANY($1::uuid[])",
                        [i for name in late for i in probes[name]],
                    )
                ]
                figures["outbox"] = [
                    dict(r)
                    for r in await db.fetch(
                        "SELECT destination, job_type, count(*) AS n, min(job_id::text) AS first"
                        " FROM job_outbox GROUP BY 1, 2"
                    )
                ]
        finally:
            await db.close()
        if late:
            alive = next(n for n in cluster.nodes if n.node != victim)
            figures["pens"] = {
                n: q
                for n, q in (await asyncio.to_thread(cluster.queues, alive)).items()
                if n.startswith(s.namespace) and ".retry." in n
            }
            figures["fresh_publish"] = await _fresh_publishes(cluster, t, victim)
            print(f"[faults] rabbit-cluster late: {figures}", flush=True)
        assert not late, figures
        survivor = next(n for n in cluster.nodes if n.node != victim)
        after = cluster.queues(survivor)[busiest]
        assert after["leader"] != victim, after
        figures["new_leader"] = after["leader"]
        await _wave(stack, ledger, 10)
        figures["rejoin_s"] = round(await asyncio.to_thread(cluster.revive, victim), 1)
        assert victim in cluster.running(survivor)
        assert victim in cluster.queues(survivor)[busiest]["members"]  # type: ignore[operator]
        await _wave(stack, ledger, 5)
        v = await check(s.database_url, stack.accepted, ledger, label="rabbit-cluster",
                        timeout=120)  # fmt: skip
    v.extra.update(figures)
    print(v.summary(), flush=True)
    v.assert_clean(expect="COMPLETED")
    assert v.accepted >= 300 + 4 * (5 + 10 + 3 + 10 + 5)


async def _fresh_publishes(cluster: PrivateCluster, t: Topology, victim: str) -> dict[str, str]:
    """Diagnosis of a late type: from a new connection to each live node, one confirmed publish
    to the 4 s pen's exchange and one to the high band of ``work`` (a body no worker accepts:
    the test has failed by then). Tells a queue that refuses everyone from a relay channel that
    is stuck."""
    import aio_pika

    out: dict[str, str] = {}
    for node in cluster.nodes:
        if node.node == victim:
            continue
        try:
            conn = await aio_pika.connect(node.amqp_url, timeout=5)
        except Exception as exc:
            out[node.node] = f"connect: {exc!r}"
            continue
        try:
            channel = await conn.channel(publisher_confirms=True)
            pen = await channel.get_exchange(t.pen_exchange(4), ensure=False)
            for name, exchange, key in (
                ("pen", pen, "diagnosis"),
                ("high.work", channel.default_exchange, t.high_queue("work")),
            ):
                try:
                    await exchange.publish(
                        aio_pika.Message(b"diagnosis", delivery_mode=2), key, timeout=5
                    )
                    out[f"{node.node} {name}"] = "ack"
                except Exception as exc:
                    out[f"{node.node} {name}"] = repr(exc)
        finally:
            await conn.close()
    return out


async def _wait_done(db_url: str, ids: list[str]) -> None:
    from ..stack import wait_for

    await wait_for(db_url, ids, statuses=["COMPLETED"], timeout=60)
