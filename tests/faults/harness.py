"""Running Conveyor for fault tests: components in the test's event loop (API over real HTTP,
relays with faults injected from outside, sweeper, workers) and components as real processes
(``conveyor worker|publisher|api``) that a test may SIGKILL, SIGTERM or watch die."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import httpx

from conveyor import JobRouter
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings
from conveyor.publisher.relay import Relay

from ..stack import Stack as BaseStack
from ..stack import running_stack
from .infra import port_open

REPO = Path(__file__).resolve().parents[2]
APP = "tests.faults.apps:router"


def conveyor_command() -> list[str]:
    script = Path(sys.executable).parent / "conveyor"
    return [str(script)] if script.exists() else [str(REPO / ".venv" / "bin" / "conveyor")]


def fault_settings(base: Settings, **overrides: Any) -> Settings:
    """Fast clocks for fault tests: 2 s leases, quick sweeps and relays."""
    defaults: dict[str, Any] = {
        "visibility_timeout": 2.0,
        "lease_sweep_interval": 0.3,
        "relay_poll_interval": 0.2,
        "schedule_interval": 0.2,
        "shutdown_grace": 2.0,
        "reconcile_after": 5.0,
        "reconcile_interval": 1.0,
    }
    return base.model_copy(update={**defaults, **overrides})


def component_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a ``conveyor`` subprocess with ``settings``. Its workers and APIs run
    no relay or maintenance duties unless ``settings`` ask for them (``run_duties=True``): the
    tests start the relays and sweepers they inject faults into, and a worker relaying beside
    them would route around the faults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"CONVEYOR_{name.upper()}"] = str(value)
    if "run_duties" not in settings.model_fields_set:
        env["CONVEYOR_RUN_DUTIES"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# --------------------------------------------------------------------------- processes


# Every subprocess a test starts; the ``_reap`` fixture (conftest.py) kills what a failed test
# left running.
LIVE: list[Proc] = []


class Proc:
    """One ``conveyor`` subprocess, its output in a log file."""

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.args = list(args)
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> Proc:
        with self.log_path.open("ab") as log:
            log.write(f"--- start {' '.join(self.args)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.started_at = time.monotonic()
        LIVE.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    async def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout``."""
        assert self.popen is not None
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.02)
        return self.popen.returncode

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        await self.wait(10)

    async def stop(self, timeout: float = 15.0) -> int | None:
        self.signal(signal.SIGTERM)
        code = await self.wait(timeout)
        if code is None:
            await self.kill()
        return code

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    async def wait_for_log(self, text: str, timeout: float = 20.0, *, after: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log()[after:]:
            if not self.alive():
                raise AssertionError(f"{self.name} exited {self.popen and self.popen.returncode}:"
                                     f"\n{self.log()[-3000:]}")  # fmt: skip
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: no {text!r} in {timeout}s:\n{self.log()[-3000:]}"
                )
            await asyncio.sleep(0.05)


def worker_proc(
    settings: Settings,
    log_dir: Path,
    name: str,
    *,
    concurrency: int = 4,
    app: str = APP,
    types: Sequence[str] | None = None,
) -> Proc:
    args = [*conveyor_command(), "worker", "--app", app, "--concurrency", str(concurrency)]
    if types:
        args += ["--types", ",".join(types)]
    return Proc(name, args, component_env(settings), log_dir)


class WorkerFleet:
    """N worker processes; a supervisor (like Kubernetes) starts a new one when one dies.
    ``types``: the job types of each slot (``--types``; None: every handler of the app)."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        size: int,
        *,
        concurrency: int = 4,
        app: str = APP,
        types: Sequence[Sequence[str] | None] | None = None,
    ) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.concurrency = concurrency
        self.app = app
        self.types = list(types) if types is not None else [None] * size
        self.slots: list[Proc] = []
        self.generation = 0
        self.kills = 0
        self.deaths = 0  # exits nobody asked for (observed by the supervisor)
        self.exit_codes: list[int] = []
        for i in range(size):
            self.slots.append(self._spawn(i))

    def _spawn(self, slot: int) -> Proc:
        self.generation += 1
        p = worker_proc(
            self.settings, self.log_dir, f"worker-{self.generation}",
            concurrency=self.concurrency, app=self.app, types=self.types[slot],
        )  # fmt: skip
        return p.start()

    async def ready(self, timeout: float = 30.0) -> None:
        for p in list(self.slots):
            await p.wait_for_log("worker_started", timeout)

    async def kill_one(self, rng: random.Random) -> Proc:
        """SIGKILL a random worker and start its replacement at once."""
        i = rng.randrange(len(self.slots))
        victim = self.slots[i]
        victim.signal(signal.SIGKILL)
        # replaced before the next await, so ``supervise`` never mistakes the victim for a death
        self.slots[i] = self._spawn(i)
        self.kills += 1
        await victim.wait(10)
        return victim

    async def supervise(self, stop: asyncio.Event, interval: float = 0.1) -> None:
        while not stop.is_set():
            for i, p in enumerate(self.slots):
                if not p.alive():
                    self.deaths += 1
                    if p.popen is not None and p.popen.returncode is not None:
                        self.exit_codes.append(p.popen.returncode)
                    self.slots[i] = self._spawn(i)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def stop(self) -> list[int | None]:
        return list(await asyncio.gather(*(p.stop() for p in self.slots)))

    def logs(self) -> str:
        return "\n".join(f"===== {p.name}\n{p.log()[-2000:]}" for p in self.slots)


# --------------------------------------------------------------------------- in-process stack


@dataclass
class Stack(BaseStack):
    """The shared test stack, remembering every accepted job for the checker."""

    accepted: list[str] = field(default_factory=list)

    async def submit(self, job_type: str, payload: dict[str, Any] | None = None, **kw: Any) -> str:
        job_id = await super().submit(job_type, payload, **kw)
        self.accepted.append(job_id)
        return job_id

    async def submit_many(
        self,
        n: int,
        job_type: str,
        payload: Callable[[int], dict[str, Any]],
        *,
        parallel: int = 16,
        pace: float = 0.0,
    ) -> list[str]:
        """``n`` POST /jobs, ``parallel`` at a time, ``pace`` seconds between waves."""
        ids: list[str] = []
        for start in range(0, n, parallel):
            wave = range(start, min(n, start + parallel))
            ids += await asyncio.gather(*(self.submit(job_type, payload(i)) for i in wave))
            if pace:
                await asyncio.sleep(pace)
        return ids

    async def submit_batch(self, job_type: str, payloads: Sequence[dict[str, Any]]) -> list[str]:
        """``POST /jobs/batch``: all in one transaction (and one outbox batch)."""
        body = {"jobs": [{"type": job_type, "payload": p} for p in payloads]}
        r = await self.client.post("/jobs/batch", json=body)
        assert r.status_code == 201, r.text
        ids = [str(j["id"]) for j in r.json()["jobs"]]
        self.accepted += ids
        return ids


def running(
    settings: Settings,
    *,
    routers: Sequence[JobRouter] = (),
    concurrency: int = 8,
    relay_setup: Callable[[Relay], Any] | None = None,
    relays: int = 1,
    sweeper: bool = True,
) -> contextlib.AbstractAsyncContextManager[Stack]:
    """``tests.stack.running_stack`` with one in-process worker per router and a ``Stack`` that
    remembers every accepted job for the checker."""
    return running_stack(
        settings,
        routers=routers,
        concurrency=concurrency,
        relay_setup=relay_setup,
        relays=relays,
        maintenance=sweeper,
        stack_class=Stack,
    )


# --------------------------------------------------------------------------- broker helpers


async def publish_raw(
    amqp_url: str,
    exchange: str,
    routing_key: str,
    bodies: Sequence[bytes],
    *,
    message_ids: Sequence[str | None] | None = None,
) -> None:
    """Publish bodies as they are (persistent, confirmed) — duplicates and poison alike."""
    conn = await aio_pika.connect(amqp_url, timeout=10)
    try:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(exchange, ensure=True)
        ids = message_ids or [None] * len(bodies)
        await asyncio.gather(
            *(
                ex.publish(
                    aio_pika.Message(
                        body,
                        content_type="application/json",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        message_id=mid,
                    ),
                    routing_key=routing_key,
                    mandatory=True,
                )
                for body, mid in zip(bodies, ids, strict=True)
            )
        )
    finally:
        await conn.close()


async def queue_ready(amqp_url: str, name: str) -> int:
    """Ready messages in a queue (passive declare); -1 when it does not exist."""
    conn = await aio_pika.connect(amqp_url, timeout=10)
    try:
        ch = await conn.channel()
        try:
            q = await ch.declare_queue(name, passive=True)
        except aio_pika.exceptions.ChannelClosed:
            return -1
        return int(q.declaration_result.message_count or 0)
    finally:
        await conn.close()


async def drain(amqp_url: str, name: str, *, settle: float = 0.5) -> list[aio_pika.IncomingMessage]:
    """Take every message out of a queue (acknowledged: the queue ends empty)."""
    conn = await aio_pika.connect(amqp_url, timeout=10)
    out: list[aio_pika.IncomingMessage] = []
    try:
        ch = await conn.channel()
        q = await ch.declare_queue(name, passive=True)
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < settle:
            msg = await q.get(no_ack=True, fail=False)
            if msg is None:
                await asyncio.sleep(0.05)
                continue
            out.append(msg)
            quiet_since = time.monotonic()
    finally:
        await conn.close()
    return out


async def purge(amqp_url: str, name: str) -> int:
    """Purge a queue over AMQP (what an operator's "purge" button does); returns how many
    ready messages the broker deleted."""
    conn = await aio_pika.connect(amqp_url, timeout=10)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue(name, passive=True)
        result = await q.purge()
        return int(result.message_count or 0)
    finally:
        await conn.close()


def topology(settings: Settings) -> Topology:
    return Topology(settings.namespace)


async def wait_until(
    predicate: Callable[[], Any], *, timeout: float, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll ``predicate`` (sync or async) until truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def http_ok(port: int, path: str = "/healthz", timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as c:
        while True:
            if port_open(port):
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get(path)).status_code == 200:
                        return
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing answers on :{port}{path}")
            await asyncio.sleep(0.1)
