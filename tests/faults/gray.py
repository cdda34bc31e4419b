"""The gray nemesis: faults that leave connections open. A crash closes a process's connections,
so PostgreSQL ends its transactions and RabbitMQ requeues its deliveries; a *pause* (VM freeze,
long GC, live migration), a *partition* or a *lost host* does not: the sessions stay open with
their locks held, and the server cannot tell them from a slow client.

Every component is a real process — two publishers that die between confirm and delete
(``crashing_publisher``), two ``conveyor sweeper``s, two ``conveyor worker``s, one
``conveyor api`` — whose PostgreSQL and RabbitMQ connections go through TCP proxies of its own
(``proxy.py``), restarted when it dies. Faults, one every ``chaos_every`` seconds:

- ``pause``: SIGSTOP one component for 2-30 s, then SIGCONT; biased to land inside a transaction
  (its session ``idle in transaction``/active with ``xact_start`` set in ``pg_stat_activity``,
  found through the proxies' upstream ports);
- ``partition``: blackhole one component's PostgreSQL and/or RabbitMQ proxy for 10-60 s (bytes
  held, connections open, new connections hang), then heal. The proxy's own socket still answers
  the server's TCP keepalives, so this partition is ended by the sessions' idle bound, never by
  the keepalives;
- ``link`` (with ``link_host``, which needs the private cluster): the components named there run
  on a second host, a network namespace (``netns.Link``) that reaches PostgreSQL directly and
  RabbitMQ through a proxy listening on the link (AMQP heartbeat 10 s, so the broker's side of a
  cut ends within it). The link goes down for 10-60 s, aimed like a partition, then comes back:
  no socket answers for the host meanwhile, so only the server's bounds end its sessions — the
  idle bound those inside a transaction, the keepalives and ``tcp_user_timeout`` the others (and
  the relay's, whose idle bound is longer). Each cut's sessions are followed: ended, and by which
  bound (the server log, ``netns.session_endings``), or survived (``link_sessions``);
- ``lost``: SIGSTOP a component inside a transaction and never resume it (a host that is gone
  while the server keeps its session); a replacement starts 5-10 s later, as an orchestrator
  would. Aimed, in the last third of the run, at a publisher inside its relay transaction, a
  worker inside a limited type's claim and a sweeper inside the schedules transaction;
- the crash faults of ``nemesis.py``: SIGKILL of any component, RabbitMQ connection drops and
  restarts, and PostgreSQL restarts — the latter only in the first ``pg_restarts_until`` of the
  run, since a restart ends every session and would rescue a lost host's locks.

The load: batches of ``work`` jobs and of ``sync_work`` (a concurrency limit of 3, so workers take
the limited claim's type lock), and a schedule ticking every second."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

from conveyor.jobs.schedules import build_schedule
from conveyor.store import for_schema

from .. import db as tdb
from . import netns
from .harness import Proc, component_env, conveyor_command, http_ok, purge, topology
from .infra import free_port
from .nemesis import Nemesis
from .proxy import Proxy

LIMITED = "sync_work"
SCHEDULE = "gray"
# what a lost host is aimed at: (kind, a word of its in-transaction statement)
LOST_TARGETS = (("publisher", "job_outbox"), ("worker", "job_types"), ("sweeper", "schedules"))


def via(url: str, port: int, host: str = "127.0.0.1", query: str | None = None) -> str:
    """``url`` with its host and port replaced by the proxy's (and its query by ``query``)."""
    parts = urlsplit(url)
    creds = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    parts = parts._replace(netloc=f"{creds}{host}:{port}")
    return urlunsplit(parts if query is None else parts._replace(query=query))


def where(query: str) -> str:
    """A short name for the statement a session was in."""
    for word in ("job_outbox", "job_types", "schedules", "jobs"):
        if word in query:
            return word
    return "other"


@dataclass
class Session:
    """A row of ``pg_stat_activity`` (client sessions only)."""

    pid: int
    addr: str
    port: int
    app: str
    in_txn: bool
    query: str
    state: str = ""


@dataclass
class Component:
    name: str
    kind: str
    args: list[str]
    pg: Proxy | None  # None on the link's host: it reaches PostgreSQL directly
    amqp: Proxy
    link: netns.Link | None = None
    proc: Proc | None = None
    state: str = "running"  # running | paused | partitioned | lost
    port: int = 0  # the API's

    def owns(self, s: Session) -> bool:
        if self.link is not None:  # one component of each kind on the link's host
            return s.addr == self.link.ns_ip and s.app == f"conveyor-{self.kind}"
        return self.pg is not None and s.addr == "127.0.0.1" and s.port in self.pg.upstream_ports


@dataclass
class GrayNemesis(Nemesis):
    pause_s: tuple[float, float] = (2.0, 30.0)
    partition_s: tuple[float, float] = (10.0, 60.0)
    in_txn_p: float = 0.7  # share of pauses and partitions aimed inside a transaction
    lost_hosts: bool = True
    pg_restarts_until: float = 0.6  # share of the run
    max_gray: int = 2  # pauses and partitions at once
    link_host: tuple[str, ...] = ()  # components on the second host (``link``; needs ``pg``)
    link_overrides: dict[str, Any] = field(default_factory=dict)  # their settings' changes
    link: netns.Link | None = None
    link_sessions: Counter[str] = field(default_factory=Counter)  # each cut's sessions' fate
    link_cuts: list[float] = field(default_factory=list)  # seconds each cut lasted
    components: list[Component] = field(default_factory=list)
    lost_procs: list[Proc] = field(default_factory=list)
    landed: Counter[str] = field(default_factory=Counter)  # frozen inside a transaction: where
    notes: list[str] = field(default_factory=list)
    _gray: set[asyncio.Task[None]] = field(default_factory=set)
    _watch: Any = None  # the aiming connection
    _watching: asyncio.Lock = field(default_factory=asyncio.Lock)  # one query at a time on it

    # ------------------------------------------------------------------ components

    async def _build(self) -> None:
        s = self.settings
        cmd = conveyor_command()
        worker = [*cmd, "worker", "--app", "tests.faults.nemesis_app:router", "--concurrency", "6"]
        kinds = [("api", [*cmd, "api"])]
        for i in (1, 2):
            kinds += [(f"publisher-{i}", [sys.executable, "-m", "tests.faults.crashing_publisher"]),
                      (f"sweeper-{i}", [*cmd, "sweeper"]), (f"worker-{i}", worker)]  # fmt: skip
        if self.link_host:
            assert self.pg is not None, "the link's host needs the private cluster"
            self.link = netns.Link()
            self.link.create()  # in ``link`` before: ``close`` undoes a partial create
            await asyncio.to_thread(self.pg.reach_from, self.link.host_ip, self.link.ns_ip)
        for name, args in kinds:
            pg_t, amqp_t = urlsplit(s.database_url), urlsplit(s.amqp_url)
            link = self.link if name in self.link_host else None
            pg = None
            if link is None:
                pg = Proxy(pg_t.hostname or "127.0.0.1", pg_t.port or 5432)
                await pg.start()
            amqp = Proxy(amqp_t.hostname or "127.0.0.1", amqp_t.port or 5672,
                         listen=link.host_ip if link else "127.0.0.1")  # fmt: skip
            await amqp.start()
            self.components.append(Component(name, name.split("-")[0], args, pg, amqp, link))

    def _spawn(self, c: Component) -> Proc:
        url, amqp_url = self.settings.database_url, self.settings.amqp_url
        if c.link is None:
            assert c.pg is not None
            s = self.settings.model_copy(update={
                "database_url": via(url, c.pg.port), "amqp_url": via(amqp_url, c.amqp.port),
            })  # fmt: skip
        else:  # PostgreSQL directly, RabbitMQ through the proxy on the link
            s = self.settings.model_copy(update={
                "database_url": via(url, urlsplit(url).port or 5432, c.link.host_ip),
                "amqp_url": via(amqp_url, c.amqp.port, c.link.host_ip, "heartbeat=10"),
                **self.link_overrides,
            })  # fmt: skip
        args = [*c.link.exec_prefix(), *c.args] if c.link is not None else list(c.args)
        if c.kind == "api":  # a new port each time: a lost API may still hold the old one
            c.port = free_port()
            args += ["--port", str(c.port)]
        env = component_env(s, FAULTS_CRASH_P=str(self.crash_p))
        c.proc = Proc(c.name, args, env, self.log_dir).start()
        return c.proc

    @property
    def api(self) -> Component:
        return self.components[0]

    async def _supervise_all(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for c in self.components:
                if c.state in ("running", "partitioned") and not (c.proc and c.proc.alive()):
                    self.restarts += 1
                    self._spawn(c)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    # ------------------------------------------------------------------ aiming

    async def _sessions(self, in_txn: bool = True) -> list[Session]:
        """Every client session (only those inside a transaction: ``in_txn``), on one connection
        kept open (aiming polls every 20 ms; a link's heal reads them too)."""
        async with self._watching:
            if self._watch is None or self._watch.is_closed():
                self._watch = await asyncpg.connect(self.settings.database_url, timeout=5)
            try:
                rows = await self._watch.fetch(
                    "SELECT pid, host(client_addr) AS addr, client_port, application_name,"
                    " query, xact_start IS NOT NULL AS in_txn, state FROM pg_stat_activity"
                    " WHERE client_port IS NOT NULL AND pid <> pg_backend_pid()"
                    " AND (xact_start IS NOT NULL OR NOT $1)", in_txn, timeout=5,
                )  # fmt: skip
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                self._watch.terminate()
                self._watch = None
                raise
        return [Session(int(r["pid"]), str(r["addr"]), int(r["client_port"]),
                        str(r["application_name"]), bool(r["in_txn"]), str(r["query"]),
                        str(r["state"])) for r in rows]  # fmt: skip

    async def _holds(self, kind: str) -> bool:
        """Does someone hold the lock a lost ``kind`` is aimed at: the limited type's row, the
        schedule's row, outbox rows?"""
        probe = {
            "worker": f"SELECT 1 FROM job_types WHERE name = '{LIMITED}' FOR UPDATE NOWAIT",
            "sweeper": f"SELECT 1 FROM schedules WHERE name = '{SCHEDULE}' FOR UPDATE NOWAIT",
            "publisher": "SELECT (SELECT count(*) FROM job_outbox) - (SELECT count(*) FROM"
            " (SELECT 1 FROM job_outbox FOR UPDATE SKIP LOCKED) s) > 0",
        }[kind]
        conn = await tdb.connect(self.settings.database_url, timeout=5)
        try:
            async with conn.transaction():
                return bool(await conn.fetchval(probe)) if kind == "publisher" else (
                    await conn.fetchval(probe) is None)  # fmt: skip
        except asyncpg.LockNotAvailableError:
            return True
        finally:
            await conn.close()

    def _running(self, kind: str | None = None, *, linked: bool | None = None) -> list[Component]:
        """Running components (of ``kind``; on the link's host or not: ``linked``)."""
        return [c for c in self.components if c.state == "running" and c.proc is not None
                and c.proc.alive() and kind in (None, c.kind)
                and linked in (None, c.link is not None)]  # fmt: skip

    async def _aim(
        self, kind: str | None, word: str | None, patience: float, *, linked: bool | None = None
    ) -> Component | None:
        """A running component (of ``kind``) whose session is inside a transaction (whose last
        statement names ``word``), looked for during ``patience`` seconds; else any."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                                     TimeoutError):  # fmt: skip
                for s in await self._sessions():
                    for c in self._running(kind, linked=linked):
                        if c.owns(s) and (word is None or word in s.query):
                            return c
            await asyncio.sleep(0.02)
        found = self._running(kind, linked=linked)
        return self.rng.choice(found) if found else None

    async def _freeze(self, c: Component) -> tuple[Proc, str]:
        """SIGSTOP ``c``; returns the process and where it froze ('' outside a transaction)."""
        assert c.proc is not None
        proc = c.proc
        proc.signal(signal.SIGSTOP)
        await asyncio.sleep(0.1)  # a statement in flight finishes on the server
        spot = ""
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                                 TimeoutError):  # fmt: skip
            spots = [s.query for s in await self._sessions() if c.owns(s)]
            spot = where(spots[0]) if spots else ""
        if spot:
            self.landed[f"{c.kind}:{spot}"] += 1
        return proc, spot

    # ------------------------------------------------------------------ gray faults

    def _later(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._gray.add(task)
        task.add_done_callback(self._gray.discard)

    async def _pause(self) -> None:
        aimed = self.rng.random() < self.in_txn_p
        c = await self._aim(None, None, 5.0 if aimed else 0.0)
        if c is None:
            return
        c.state = "paused"
        proc, _ = await self._freeze(c)
        self.faults[f"pause_{c.kind}"] += 1

        async def resume() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(self.rng.uniform(*self.pause_s))
            proc.signal(signal.SIGCONT)
            c.state = "running"

        self._later(resume())

    async def _partition(self) -> None:
        aimed = self.rng.random() < self.in_txn_p
        c = await self._aim(None, None, 5.0 if aimed else 0.0, linked=False)
        if c is None or c.pg is None:
            return
        side = self.rng.choice(["pg", "amqp", "both"])
        proxies = {"pg": [c.pg], "amqp": [c.amqp], "both": [c.pg, c.amqp]}[side]
        for p in proxies:
            p.blackhole()
        c.state = "partitioned"
        self.faults[f"partition_{c.kind}_{side}"] += 1

        async def heal() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(self.rng.uniform(*self.partition_s))
            for p in proxies:
                p.heal()
            c.state = "running"

        self._later(heal())

    async def _cut(self) -> None:
        """Take the link's host off the network for ``partition_s``; record what became of the
        sessions it had (``link_sessions``: ended by which bound, or survived)."""
        link, pg = self.link, self.pg
        if link is None or pg is None or link.is_down:
            return
        aimed = self.rng.random() < self.in_txn_p
        await self._aim(None, None, 5.0 if aimed else 0.0, linked=True)
        offset = netns.log_size(pg.log)
        await asyncio.to_thread(link.down)
        started = time.monotonic()
        before: list[Session] = []  # the host's sessions as the link went (the server's view)
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                                 TimeoutError):  # fmt: skip
            before = [s for s in await self._sessions(in_txn=False) if s.addr == link.ns_ip]
        on = [c for c in self.components if c.link is not None]
        for c in on:
            if c.state == "running":
                c.state = "partitioned"
        self.faults["partition_link"] += 1
        for s in before:
            if s.in_txn:
                self.landed[f"link:{s.app.removeprefix('conveyor-')}:{where(s.query)}"] += 1

        async def heal() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(self.rng.uniform(*self.partition_s))
            try:
                now: dict[int, Session] | None = None
                with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                                         TimeoutError):  # fmt: skip
                    now = {s.pid: s for s in await self._sessions(in_txn=False)}
                why = netns.session_endings(pg.log, offset)
                for s in before:
                    if now is None:
                        self.link_sessions["unread"] += 1
                    elif s.pid in now:  # an active statement reads nothing from its socket
                        self.link_sessions[f"survived_{now[s.pid].state}"] += 1
                    else:
                        kind = "in_txn" if s.in_txn else "idle"
                        self.link_sessions[f"{why.get(s.pid, 'unexplained')}_{kind}"] += 1
            finally:
                await asyncio.to_thread(link.up)
                self.link_cuts.append(round(time.monotonic() - started, 1))
                for c in on:
                    if c.state == "partitioned":
                        c.state = "running"

        self._later(heal())

    async def _lose(self, kind: str, word: str, patience: float = 60.0) -> None:
        """Freeze a ``kind`` for good once it is caught holding the lock ``word`` names (a
        freeze that misses is resumed at once: a pause of ~0.2 s); a replacement follows."""
        deadline = time.monotonic() + patience
        while True:
            c = await self._aim(kind, word, 10.0)
            if c is None:
                return
            c.state = "lost"
            proc, spot = await self._freeze(c)
            held = False
            with contextlib.suppress(OSError, asyncpg.PostgresError, TimeoutError):
                held = spot == word and await self._holds(kind)
            if held or time.monotonic() > deadline:
                break
            proc.signal(signal.SIGCONT)
            c.state = "running"
            self.faults["lost_missed"] += 1
        self.lost_procs.append(proc)
        self.faults[f"lost_{c.kind}"] += 1
        self.notes.append(f"lost {c.name} pid {proc.pid} frozen in {spot or 'no transaction'}"
                          f"{', holding the lock' if held else ''}"
                          f" at {time.strftime('%H:%M:%S')}")  # fmt: skip
        await asyncio.sleep(self.rng.uniform(5.0, 10.0))  # until the orchestrator notices
        c.state = "running"
        self._spawn(c)

    # ------------------------------------------------------------------ the chaos loop

    async def _crash(self, fault: str) -> None:
        if fault == "sigkill":
            found = self._running()
            if found:
                victim = self.rng.choice(found)
                assert victim.proc is not None
                await victim.proc.kill()
                self.faults[f"sigkill_{victim.kind}"] += 1
            return
        self.faults[fault] += 1
        if fault == "close_connections" and self.rabbit is not None:
            await asyncio.to_thread(self.rabbit.close_all_connections, "gray nemesis")
        elif fault == "broker_restart" and self.rabbit is not None:
            await asyncio.to_thread(self.rabbit.restart, self.rng.uniform(0.5, 2.0))
        elif fault == "purge_work_queue":
            with contextlib.suppress(Exception):
                await purge(self.settings.amqp_url, topology(self.settings).work_queue("work"))
        elif fault == "postgres_restart" and self.pg is not None:
            await asyncio.to_thread(self.pg.restart, self.rng.uniform(0.5, 2.0))

    async def _gray_chaos(self, seconds: float, stop: asyncio.Event) -> None:
        started = time.monotonic()
        lost = list(LOST_TARGETS) if self.lost_hosts else []
        lost_at = [seconds * f for f in (0.68, 0.76, 0.84)]
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(*self.chaos_every))
            if stop.is_set():
                return
            elapsed = time.monotonic() - started
            if lost and elapsed >= lost_at[len(LOST_TARGETS) - len(lost)]:
                await self._lose(*lost.pop(0))
                continue
            menu = {"pause": 4.0, "partition": 2.0, "sigkill": 2.0}
            if self.link is not None:
                menu["link"] = 1.5
            if len(self._gray) >= self.max_gray:
                menu.update(pause=0.0, partition=0.0, link=0.0)
            if self.rabbit is not None:
                menu.update(close_connections=0.5, broker_restart=0.3, purge_work_queue=0.3)
            if self.pg is not None and elapsed < seconds * self.pg_restarts_until:
                menu["postgres_restart"] = 0.3
            fault = self.rng.choices(list(menu), weights=list(menu.values()))[0]
            if fault == "pause":
                await self._pause()
            elif fault == "partition":
                await self._partition()
            elif fault == "link":
                await self._cut()
            else:
                await self._crash(fault)

    # ------------------------------------------------------------------ load

    async def _gray_post(self, client: httpx.AsyncClient, jobs: list[dict[str, Any]]) -> None:
        try:
            r = await client.post(f"http://127.0.0.1:{self.api.port}/jobs/batch",
                                  json={"jobs": jobs})  # fmt: skip
        except httpx.HTTPError:
            r = None
        if r is None or r.status_code != 201:  # not accepted: not the checker's business
            self.refused += len(jobs)
            return
        self.accepted += [str(j["id"]) for j in r.json()["jobs"]]

    async def _gray_submit(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            while not stop.is_set():
                sleep = round(self.rng.uniform(0.02, 0.3), 3)
                payload = {"ledger": str(self.ledger), "sleep": sleep}
                jobs = [{"type": "work", "payload": payload}] * 8
                jobs += [{"type": LIMITED, "payload": payload}] * 2
                await self._gray_post(client, jobs)
                await asyncio.sleep(0.5)

    async def _prepare(self) -> None:
        """The limit on ``LIMITED`` and the schedule, before any component starts."""
        store = for_schema(tdb.SCHEMA)
        conn = await tdb.connect(self.settings.database_url)
        try:
            await store.type_set_limits(conn, LIMITED, concurrency=3, rate_limit=None,
                                        rate_period=None)  # fmt: skip
            payload = {"ledger": str(self.ledger), "sleep": 0.05}
            await store.schedule_upsert(
                conn, build_schedule(SCHEDULE, "work", every_seconds=1, payload=payload)
            )
        finally:
            await conn.close()

    # ------------------------------------------------------------------ the run

    @contextlib.asynccontextmanager
    async def gray_running(self, seconds: float) -> AsyncIterator[float]:
        """Run the load and the chaos for ``seconds``, then resume every pause and heal every
        partition (lost hosts stay frozen); yields the time the faults stopped (``time.time``)
        with everything still running, then kills every process."""
        await self._prepare()
        stop, quiet = asyncio.Event(), asyncio.Event()
        try:
            await self._build()
            for c in self.components:
                self._spawn(c)
            for c in self.components:
                assert c.proc is not None
                if c.kind == "worker":
                    await c.proc.wait_for_log("worker_started", 90)
            await http_ok(self.api.port, timeout=90)
            supervisor = asyncio.create_task(self._supervise_all(quiet))
            load = [asyncio.create_task(self._gray_submit(stop)),
                    asyncio.create_task(self._gray_chaos(seconds, stop))]  # fmt: skip
            await asyncio.sleep(seconds)
            stop.set()
            await asyncio.gather(*load)
            for task in list(self._gray):
                task.cancel()
            await asyncio.gather(*self._gray, return_exceptions=True)
            yield time.time()
            quiet.set()
            await supervisor
        finally:
            quiet.set()
            for c in self.components:
                for proxy in (c.pg, c.amqp):
                    if proxy is not None:
                        proxy.heal()
            procs = [c.proc for c in self.components if c.proc is not None]
            for p in [*procs, *self.lost_procs]:
                await p.kill()
            for c in self.components:
                for proxy in (c.pg, c.amqp):
                    if proxy is not None:
                        await proxy.close()
            if self._watch is not None:
                self._watch.terminate()
            if self.link is not None:
                self.link.close()
                if self.pg is not None:
                    self.pg.unreach(self.link.host_ip)
