"""Least privilege in PostgreSQL: each component runs under a role holding only ``store.roles``'
grants (on the real server) and a job's whole life works: submit, run, fail to a dead letter,
schedule and promotion, cancel, redrive, dashboard purge, lease recovery, retention, gauges,
keys. Then each role tries what it must not do (DDL, TRUNCATE, DROP, another component's
writes, the key table) and is refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from conveyor.cli.keys import create_key
from conveyor.cli.processes import api_server, serve_api
from conveyor.core.config import Settings
from conveyor.maintenance.gauges import Gauges
from conveyor.maintenance.sweeper import Sweeper
from conveyor.publisher.relay import Relay
from conveyor.store.roles import COMPONENTS, grant_statements
from conveyor.worker import Worker

from .. import apps
from ..conftest import RUN_ID
from ..db import as_role
from ..stack import free_port, wait_for


@contextlib.asynccontextmanager
async def component_roles(db: asyncpg.Connection, tag: str) -> AsyncIterator[dict[str, str]]:
    roles = {c: f"c{RUN_ID}_{tag}_{c}" for c in COMPONENTS}
    for role in roles.values():
        await db.execute(f"CREATE ROLE {role} LOGIN")
    try:
        for statement in grant_statements("conveyor", roles):
            await db.execute(statement)
        yield roles
    finally:
        for role in roles.values():
            await db.execute(f"DROP OWNED BY {role}")  # its grants in this database
            await db.execute(f"DROP ROLE {role}")


FORBIDDEN = {
    "any": [
        "CREATE TABLE conveyor.intruder (i int)",
        "CREATE INDEX intruder ON conveyor.jobs (priority)",
        "ALTER TABLE conveyor.jobs ADD COLUMN intruder int",
        "DROP TABLE conveyor.jobs",
        "TRUNCATE conveyor.jobs",
        "TRUNCATE conveyor.job_outbox",
        "DROP VIEW conveyor.backlog",
        "INSERT INTO conveyor.api_keys VALUES ('x', 'x', '\\x00'::bytea, '{admin}')",
        "UPDATE conveyor.api_keys SET scopes = '{admin}'",
        "DELETE FROM conveyor.alembic_version",
        "TRUNCATE conveyor.api_rate",
    ],
    "api": ["DELETE FROM conveyor.job_outbox", "UPDATE conveyor.job_types SET max_retries = 0",
            "DELETE FROM conveyor.api_rate"],
    # (the worker deletes the outbox rows of released jobs it runs itself: job_claim_released)
    "worker": ["DELETE FROM conveyor.jobs", "UPDATE conveyor.job_outbox SET priority = 0",
               "DELETE FROM conveyor.workflows", "INSERT INTO conveyor.job_dependencies "
               "SELECT id, id FROM conveyor.jobs LIMIT 1",
               "SELECT count(*) FROM conveyor.api_keys", "SELECT count(*) FROM conveyor.api_rate"],
    "sweeper": ["DELETE FROM conveyor.job_outbox", "SELECT count(*) FROM conveyor.api_keys",
                "DELETE FROM conveyor.schedules"],
    # the publisher runs the sweeper's duties by default, schedule ticks (new jobs) included
    "publisher": ["SELECT count(*) FROM conveyor.api_keys", "DELETE FROM conveyor.schedules",
                  "UPDATE conveyor.job_types SET paused = true"],
}  # fmt: skip


@pytest.mark.timeout(120)
async def test_each_component_under_its_own_role(
    settings: Settings, db: asyncpg.Connection, db_url: str
) -> None:
    async with component_roles(db, "pg") as roles:
        s = {c: settings.model_copy(update={"database_url": as_role(db_url, r)})
             for c, r in roles.items()}  # fmt: skip
        # a submit quota: the API's role takes from the fleet-wide buckets (api_rate)
        api_settings = s["api"].model_copy(update={"auth": "required", "rate_limit": "1000/s"})
        key = await create_key(settings, "ops", "admin")  # `conveyor keys` runs as the owner
        headers = {"Authorization": f"Bearer {key}"}
        stop = asyncio.Event()
        port = free_port()
        server = api_server(api_settings, "127.0.0.1", port)
        tasks = [asyncio.create_task(serve_api(server, stop))]
        relay, sweeper = Relay(s["publisher"]), Sweeper(s["publisher"])
        duties = Sweeper(s["sweeper"])
        worker = Worker(s["worker"], apps.router, concurrency=4)
        for part in (relay, sweeper, duties, worker):
            await part.start()
        tasks += [asyncio.create_task(relay.run(stop)), asyncio.create_task(sweeper.run(stop))]
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         headers=headers) as c:  # fmt: skip
                await _life(c, db_url)
                gauges = Gauges(relay.metrics, sweeper.store, sweeper.pool, sweeper.topology,
                                queue_depth=sweeper._queue_depth)  # fmt: skip
                await gauges.refresh_once()
            await worker.stop(grace=2)
            stop.set()
            await asyncio.gather(*tasks)
            # the maintenance duties, one step each, under the sweeper's role and then under
            # the publisher's (which runs them by default); nothing else runs them now
            for part in (duties, sweeper):
                await _duties(db, part)
        finally:
            if not stop.is_set():
                await worker.stop(grace=2)
                stop.set()
                await asyncio.gather(*tasks)
            for part in (relay, sweeper, duties):
                await part.close()
        assert await db.fetchval("SELECT count(*) FROM conveyor.api_rate") == 1  # the key's
        for component, role in roles.items():
            conn = await asyncpg.connect(as_role(db_url, role))
            try:
                for sql in [*FORBIDDEN["any"], *FORBIDDEN[component]]:
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await conn.execute(sql)
            finally:
                await conn.close()


async def _life(c: httpx.AsyncClient, db_url: str) -> None:
    async def submit(body: dict[str, object]) -> str:
        r = await c.post("/jobs", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    done = await submit({"type": "echo", "payload": {"n": 1}})
    dead = await submit({"type": "always_fails", "max_retries": 0})
    later = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    promoted = await submit({"type": "echo", "run_at": later})
    cancelled = await submit({"type": "echo", "run_at": "2030-01-01T00:00:00Z"})
    assert (await c.post(f"/jobs/{cancelled}/cancel")).status_code == 200
    await wait_for(db_url, [done, promoted], statuses=["COMPLETED"], timeout=30)
    await wait_for(db_url, [dead], statuses=["FAILED"], timeout=30)
    assert (await c.get(f"/jobs/{done}/attempts")).status_code == 200
    assert (await c.get("/ui")).status_code == 200
    assert (await c.post(f"/jobs/{dead}/retry")).status_code == 200
    await wait_for(db_url, [dead], statuses=["FAILED"], timeout=30)
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = await c.post("/ui/dead/purge", content="confirm=yes&type=always_fails", headers=form)
    assert r.status_code == 303 and "purge%3A+1" in r.headers["location"], r.headers
    # a workflow: submitted, released by the worker's completions (the triggers run as the
    # worker's role), read, and one cancelled through the API (as the API's role)
    chain = {"name": "pl", "jobs": [{"key": "a", "type": "echo"},
                                    {"key": "b", "type": "echo", "after": ["a"]}]}  # fmt: skip
    r = await c.post("/workflows", json=chain)
    assert r.status_code == 201, r.text
    flow = r.json()["id"]
    await wait_for(db_url, [j["id"] for j in r.json()["jobs"]], statuses=["COMPLETED"], timeout=30)
    held = {"name": "held", "jobs": [{"key": "a", "type": "echo", "run_at": "2030-01-01T00:00:00Z"},
                                     {"key": "b", "type": "echo", "after": ["a"]}]}  # fmt: skip
    r = await c.post("/workflows", json=held)
    assert r.status_code == 201, r.text
    assert (await c.post(f"/workflows/{r.json()['id']}/cancel")).status_code == 200
    for wf, status in ((flow, "COMPLETED"), (r.json()["id"], "CANCELLED")):
        for _ in range(100):
            got = (await c.get(f"/workflows/{wf}")).json()["status"]
            if got == status:
                break
            await asyncio.sleep(0.1)
        assert got == status, (wf, got)


async def _duties(db: asyncpg.Connection, sweeper: Sweeper) -> None:
    late = datetime.now(UTC) - timedelta(minutes=1)
    lost = await db.fetchval(
        "INSERT INTO jobs (id, job_type, status, priority, payload, attempts, lease_expires_at, "
        "started_at) VALUES (gen_random_uuid(), 'echo', 'IN_PROGRESS', 5, '{}', 1, $1, $1) "
        "RETURNING id", late,
    )  # fmt: skip
    await db.execute(
        "INSERT INTO jobs (id, job_type, status, priority, payload, run_at) "
        "VALUES (gen_random_uuid(), 'echo', 'SCHEDULED', 5, '{}', $1)", late,
    )  # fmt: skip
    assert await sweeper.recover_leases()
    assert await db.fetchval("SELECT status::text FROM jobs WHERE id = $1", lost) != "IN_PROGRESS"
    assert await sweeper.promote_due() == 1
    await sweeper.reconcile()
    await db.execute("UPDATE jobs SET finished_at = now() - interval '30 days', "
                     "status = 'COMPLETED' WHERE id = $1", lost)  # fmt: skip
    assert await sweeper.delete_expired() >= 1
    await sweeper.finish_workflows()  # the workflows duty, under this role
