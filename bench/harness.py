"""The state of one benchmark run: its database, namespace, subprocesses, load generators and
resource meters, and the cleanup that always runs."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from . import broker
from .db import Db, recreate_database, with_database
from .procs import CpuMeter, RssSampler, Service, listener_pid

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


@dataclass
class Options:
    quick: bool
    n: int
    rest_n: int
    latency_seconds: float
    latency_rate: float
    connections: int
    client_procs: int
    batch_size: int
    batch_connections: int
    concurrency: int
    celery_pools: list[str]
    with_backfill: bool
    backfill_rows: int
    backfill_repeat: int
    timeout: float
    http_client: str
    profile: bool
    repeat: int
    database_url: str
    amqp_url: str
    output: Path
    skip: set[str] = field(default_factory=set)
    api_workers: int = 1


def conveyor_command() -> str:
    """The ``conveyor`` console script of this interpreter's environment."""
    local = Path(sys.executable).parent / "conveyor"
    found = str(local) if local.exists() else shutil.which("conveyor")
    if found is None:
        raise SystemExit("cannot find the `conveyor` command: install the project (make install)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoadGenFailed(RuntimeError):
    pass


@dataclass
class LoadGens:
    """Load-generator subprocesses, ready and waiting for the start signal."""

    procs: list[asyncio.subprocess.Process]

    async def go(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
        await asyncio.gather(*(p.stdin.drain() for p in self.procs if p.stdin is not None))

    async def finish(self) -> list[dict[str, Any]]:
        """Each generator's report; raises ``LoadGenFailed`` when one failed or saw errors."""
        reports = []
        for p in self.procs:
            out, err = await p.communicate()
            lines = out.decode(errors="replace").strip().splitlines()
            if p.returncode != 0 or not lines:
                raise LoadGenFailed(
                    f"load generator exited with {p.returncode}: {err.decode()[-2000:]}"
                )
            report = orjson.loads(lines[-1])
            if report["errors"]:
                raise LoadGenFailed(
                    f"{report['errors']} submits failed, e.g. {report['error_samples']}"
                )
            reports.append(report)
        return reports

    def kill(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()


class Harness:
    """``database``, ``prefix``, ``logs``, ``app``: another benchmark's own (``bench.flow``):
    its database, namespace prefix, log directory and handlers (whose types ``app_types``
    names, for the queues deleted at the end)."""

    def __init__(
        self,
        opts: Options,
        *,
        database: str | None = None,
        prefix: str = "bench",
        logs: Path | None = None,
        app: str = "bench.app:router",
        app_types: tuple[str, ...] = ("noop",),
    ) -> None:
        self.opts = opts
        self.namespace = prefix + secrets.token_hex(4)
        # CONVEYOR_BENCH_DATABASE: another name, so two checkouts can benchmark side by side
        # (each run drops and recreates its database)
        name = database or os.environ.get("CONVEYOR_BENCH_DATABASE", "conveyor_bench")
        self.db_url = with_database(opts.database_url, name)
        self.logs = logs or RESULTS / "logs"
        self.app, self.app_types = app, app_types
        self.env = {
            **os.environ,
            "CONVEYOR_DATABASE_URL": self.db_url,
            "CONVEYOR_AMQP_URL": opts.amqp_url,
            "CONVEYOR_NAMESPACE": self.namespace,
            # the load generators send no API key (a cached key's check, KeyCache.verify, takes
            # ~5 us on the 2-core machine; PostgreSQL is read once per key per 2 s)
            "CONVEYOR_AUTH": "disabled",
            # each role in its own process, as measured: the publisher relays, not the API or
            # a worker (which would otherwise hold the duties, docs/architecture.md)
            "CONVEYOR_RUN_DUTIES": "false",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            "PYTHONUNBUFFERED": "1",
        }
        self.services: dict[str, Service] = {}
        self.rss = RssSampler(interval=0.2)
        self.db: Db | None = None
        self.api_url = ""
        self.conveyor = conveyor_command()
        self.celery_queue = f"{self.namespace}.celery"
        self.servers: dict[str, int | None] = {}
        atexit.register(self._kill_leftovers)  # last resort if the harness dies another way

    def _kill_leftovers(self) -> None:
        for service in self.services.values():
            with contextlib.suppress(Exception):
                service.stop(grace=5)

    # ------------------------------------------------------------------ lifecycle

    async def setup(self) -> Db:
        if self.logs.exists():
            shutil.rmtree(self.logs)
        self.logs.mkdir(parents=True)
        await recreate_database(self.db_url)
        proc = await asyncio.to_thread(
            subprocess.run,
            [self.conveyor, "migrate"],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"conveyor migrate failed ({proc.returncode}):\n{proc.stderr}")
        # a deploy step: the API accepts only registered job types (workers register theirs at
        # start; the REST workloads may submit before the worker runs)
        proc = await asyncio.to_thread(
            subprocess.run,
            [self.conveyor, "types", "register", "--app", self.app],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"conveyor types register failed:\n{proc.stderr}")
        self.db = await Db.connect(self.db_url)
        self.servers = {
            "postgres": _local_listener(self.db_url, 5432),
            "rabbitmq": _local_listener(self.opts.amqp_url, 5672),
        }
        self.rss.__enter__()
        return self.db

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Service:
        service = Service(name, argv, env or self.env, ROOT, self.logs / f"{name}.log")
        self.services[name] = service
        self.rss.watch(name, service.pid)
        return service

    def start_conveyor(self, name: str, *args: str) -> Service:
        return self.start(name, [self.conveyor, *args])

    def stop(self, name: str, grace: float = 15.0) -> int | None:
        service = self.services.pop(name, None)
        if service is None:
            return None
        self.rss.forget(name)
        return service.stop(grace)

    def check_services(self) -> None:
        for service in self.services.values():
            service.check()

    def tails(self) -> str:
        return "\n".join(s.tail(15) for s in self.services.values())

    async def close(self) -> None:
        """Stop every subprocess, delete this run's broker objects. Safe to call twice."""
        for name in list(self.services):
            with contextlib.suppress(Exception):
                self.stop(name, grace=10)
        self.rss.__exit__()
        if self.db is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.db.close(), 5)
            self.db = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.delete_broker_objects(), 60)

    async def delete_broker_objects(self) -> list[str]:
        ns = self.namespace
        queues = [
            *(f"{ns}.queue.{t}" for t in self.app_types),
            f"{ns}.dead_letter.queue",
            self.celery_queue,
        ]
        exchanges = [f"{ns}.exchange", f"{ns}.retry", f"{ns}.dead_letter", self.celery_queue]
        extra_q, extra_x = await asyncio.to_thread(_listed_with_prefix, ns)
        return await broker.delete(
            self.opts.amqp_url,
            dict.fromkeys(queues + extra_q),
            dict.fromkeys(exchanges + extra_x),
        )

    # ------------------------------------------------------------------ waiting

    async def poll(
        self,
        check: Callable[[], Awaitable[bool]],
        *,
        what: str,
        timeout: float | None = None,
        interval: float | Callable[[], float] = 0.05,
    ) -> float:
        """Await ``check()`` every ``interval`` s (or as often as ``interval()`` says after each
        check) until true; return the monotonic time it was first seen true. Fails fast when a
        service dies, ``TimeoutError`` after ``timeout``."""
        timeout = self.opts.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            self.check_services()
            if await check():
                return time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done within {timeout:.0f} s")
            await asyncio.sleep(interval() if callable(interval) else interval)

    async def wait_api(self, timeout: float = 60.0) -> None:
        async with httpx.AsyncClient(base_url=self.api_url, timeout=2) as client:

            async def healthy() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return (await client.get("/healthz")).status_code == 200
                return False

            await self.poll(healthy, what="API /healthz", timeout=timeout, interval=0.1)

    async def wait_consumer(self, queue: str, timeout: float = 60.0) -> None:
        async def consuming() -> bool:
            state = await broker.queue_state(self.opts.amqp_url, queue)
            return state is not None and state[1] >= 1

        await self.poll(consuming, what=f"a consumer on {queue}", timeout=timeout, interval=0.2)

    # ------------------------------------------------------------------ load

    async def loadgens(
        self, mode: str, n: int, *, procs: int, connections: int, rate: float = 0.0
    ) -> LoadGens:
        """Start ``procs`` load generators sharing ``n`` jobs and ``connections``; return them
        once every one is connected and waiting for the start signal."""
        argvs = []
        for i in range(procs):
            share = n // procs + (1 if i < n % procs else 0)
            conns = max(1, connections // procs + (1 if i < connections % procs else 0))
            argvs.append([
                sys.executable, "-m", "bench.loadgen", "--url", self.api_url,
                "--mode", mode, "--n", str(share), "--connections", str(conns),
                "--batch-size", str(self.opts.batch_size), "--rate", str(rate / procs or 1),
                "--client", self.opts.http_client,
            ])  # fmt: skip
        return await self.clients(argvs)

    async def clients(self, argvs: list[list[str]]) -> LoadGens:
        """Start client processes that speak the ready/go protocol (``bench.loadgen``,
        ``bench.celery_publish``); return them once every one waits for the start signal."""
        started: list[asyncio.subprocess.Process] = []
        gens = LoadGens(started)
        try:
            for argv in argvs:
                started.append(
                    await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        cwd=ROOT,
                        env=self.env,
                    )
                )
            for p in started:
                assert p.stdout is not None and p.stderr is not None
                line = await asyncio.wait_for(p.stdout.readline(), 60)
                if line.strip() != b"ready":
                    err = await p.stderr.read()
                    raise LoadGenFailed(f"client did not start: {err.decode()[-2000:]}")
        except BaseException:
            gens.kill()
            raise
        return gens

    def cpu_meter(self) -> CpuMeter:
        services = self.services
        return CpuMeter(lambda: {n: s.pid for n, s in services.items()}, self.servers).start()


def _local_listener(url: str, default_port: int) -> int | None:
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    return listener_pid(parts.port or default_port)


def _listed_with_prefix(prefix: str) -> tuple[list[str], list[str]]:
    """Queue and exchange names starting with ``prefix``, via rabbitmqctl when it is available
    (retry pens or anything else a run created); empty lists otherwise."""
    ctl = shutil.which("rabbitmqctl")
    found: list[list[str]] = []
    for kind in ("queues", "exchanges"):
        names: list[str] = []
        if ctl is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                out = subprocess.run(
                    [ctl, "-q", f"list_{kind}", "name"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout
                names = [n.strip() for n in out.splitlines() if n.strip().startswith(prefix)]
        found.append(names)
    return found[0], found[1]
