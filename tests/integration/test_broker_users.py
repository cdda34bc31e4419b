"""Least privilege in RabbitMQ: on the local broker, in a vhost of this test's own, the publisher,
the sweeper and the worker each connect as a user holding only ``broker.permissions``' patterns
(created with ``rabbitmqctl import_definitions``, removed after). Jobs complete, retry through a
pen and dead-letter; then each user tries what it must not (the worker publishing work or
reading another type's queue, the sweeper publishing, the publisher consuming) and is refused."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from urllib.parse import quote

import aio_pika
import aiormq
import httpx
import pytest

from conveyor.broker.permissions import COMPONENTS, permissions
from conveyor.cli.processes import api_server, serve_api
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper
from conveyor.publisher.relay import Relay
from conveyor.worker import Worker

from .. import apps
from ..conftest import RUN_ID
from ..stack import free_port, wait_for

TYPES = ["echo", "always_fails"]
pytestmark = pytest.mark.skipif(
    shutil.which("rabbitmqctl") is None or bool(os.environ.get("CONVEYOR_TEST_AMQP_URL")),
    reason="needs rabbitmqctl for the local broker",
)


def _hash(password: str) -> str:
    salt = secrets.token_bytes(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


async def _ctl(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "rabbitmqctl", "-q", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (args, out, err)


@contextlib.asynccontextmanager
async def broker_users(namespace: str) -> AsyncIterator[dict[str, str]]:
    """component → AMQP URL of its own user in a fresh vhost."""
    vhost = f"conveyor_t{RUN_ID}_{namespace}"
    users = {c: (f"{vhost}_{c}", secrets.token_urlsafe(12)) for c in COMPONENTS}
    perms = {c: permissions(namespace, c, TYPES if c == "worker" else None) for c in COMPONENTS}
    definitions = {
        "vhosts": [{"name": vhost}],
        "users": [{"name": u, "password_hash": _hash(p), "tags": "",
                   "hashing_algorithm": "rabbit_password_hashing_sha256"}
                  for u, p in users.values()],
        "permissions": [{"user": users[c][0], "vhost": vhost, "configure": perms[c][0],
                         "write": perms[c][1], "read": perms[c][2]} for c in COMPONENTS],
    }  # fmt: skip
    # a file the CLI can read (the test's tmp_path is private; 3.10 reads no stdin); hashes only
    fd, path = tempfile.mkstemp(prefix="conveyor-defs-", suffix=".json")
    try:
        os.write(fd, json.dumps(definitions).encode())
        os.close(fd)
        os.chmod(path, 0o644)
        await _ctl("import_definitions", path)
    finally:
        os.unlink(path)
    urls = {c: f"amqp://{u}:{p}@127.0.0.1:5672/{quote(vhost, safe='')}"
            for c, (u, p) in users.items()}  # fmt: skip
    try:
        for url in urls.values():  # the import is asynchronous: wait until each user gets in
            for attempt in range(100):
                try:
                    await (await aio_pika.connect(url)).close()
                    break
                except Exception:
                    if attempt == 99:
                        raise
                    await asyncio.sleep(0.1)
        yield urls
    finally:
        await asyncio.gather(_ctl("delete_vhost", vhost),
                             *[_ctl("delete_user", u) for u, _ in users.values()])  # fmt: skip


async def _refused(url: str, action: str, name: str) -> None:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            if action == "publish":
                ex = await ch.get_exchange(name, ensure=False)
                await ex.publish(aio_pika.Message(b'{"id": "x", "type": "echo"}'), "echo")
            elif action == "consume":
                q = await ch.get_queue(name, ensure=False)
                await q.get(fail=False)
            else:
                await ch.declare_queue(name, durable=True)
    finally:
        await conn.close()


@pytest.mark.timeout(120)
async def test_each_component_under_its_own_broker_user(settings: Settings, db_url: str) -> None:
    ns = settings.namespace
    async with broker_users(ns) as urls:
        s = {c: settings.model_copy(update={"amqp_url": u}) for c, u in urls.items()}
        stop = asyncio.Event()
        port = free_port()
        server = api_server(settings.model_copy(update={"amqp_url": "amqp://nobody@127.0.0.1:1/"}),
                            "127.0.0.1", port)  # the API never touches the broker  # fmt: skip
        tasks = [asyncio.create_task(serve_api(server, stop))]
        relay, sweeper = Relay(s["publisher"]), Sweeper(s["sweeper"])
        worker = Worker(s["worker"], apps.router, types=TYPES, concurrency=4)
        for part in (relay, sweeper, worker):
            await part.start()
        tasks += [asyncio.create_task(relay.run(stop)), asyncio.create_task(sweeper.run(stop))]
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                ok = (await c.post("/jobs", json={"type": "echo"})).json()["id"]
                bad = (await c.post("/jobs", json={"type": "always_fails", "max_retries": 1})
                       ).json()["id"]  # fmt: skip
            await wait_for(db_url, [ok], statuses=["COMPLETED"], timeout=30)
            await wait_for(db_url, [bad], statuses=["FAILED"], timeout=30)  # via a pen
            assert await sweeper.reconcile() == 0
            assert await sweeper._queue_depth("echo") == 0  # raises DepthUnknown when refused
        finally:
            await worker.stop(grace=2)
            stop.set()
            await asyncio.gather(*tasks)
            await relay.close()
            await sweeper.close()
        await _refused(urls["worker"], "publish", f"{ns}.exchange")
        await _refused(urls["worker"], "consume", f"{ns}.queue.noop")
        await _refused(urls["worker"], "declare", f"{ns}.queue.noop")
        await _refused(urls["worker"], "declare", "intruder")
        await _refused(urls["sweeper"], "publish", f"{ns}.exchange")
        await _refused(urls["publisher"], "consume", f"{ns}.dead_letter.queue")
        await _refused(urls["publisher"], "consume", f"{ns}.queue.echo")
        await _refused(urls["sweeper"], "consume", f"{ns}.queue.echo")
        await _refused(urls["publisher"], "declare", "intruder")
