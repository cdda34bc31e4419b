"""Private services for fault injection: a RabbitMQ node and a PostgreSQL cluster that the tests
may stop, crash, purge and cut off, so the shared ones on 5672/5432 are never touched.

Both follow /work/shared/RECIPES.md: the RabbitMQ node's directories belong to the ``rabbitmq``
user (the Debian wrapper runs the node as that user, and a node that cannot write dies without a
log), and PostgreSQL runs as ``postgres`` through ``runuser`` (it refuses root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), 0.5):
            return True
    except OSError:
        return False


def alive(pid: int) -> bool:
    """The process exists and is no zombie (a node's VM is a child of init, which may take
    seconds to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def kill(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL, and wait until the process is dead."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"


class PrivateRabbit:
    """One RabbitMQ node of its own: ``faults<random>@localhost`` on free ports."""

    def __init__(
        self,
        consumer_timeout_ms: int = 60000,
        channel_tick_ms: int | None = None,
        join: str | None = None,
    ) -> None:
        self.consumer_timeout_ms = consumer_timeout_ms
        # how often each channel checks its deliveries against consumer_timeout (RabbitMQ's
        # default is once a minute; rabbit's ``channel_tick_interval``, advanced.config only)
        self.channel_tick_ms = channel_tick_ms
        # a node to join while booting (peer discovery from the config file), instead of
        # ``stop_app``, ``join_cluster``, ``start_app`` after: each of those is a rabbitmqctl
        # run, an Erlang VM of its own (1-3 s of CPU)
        self.join = join
        self.node = f"faults{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="conveyor-faults-rmq-"))
        self.amqp_url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.started = False

    # ---------------------------------------------------------------- lifecycle

    def env(self) -> dict[str, str]:
        b = self.base
        advanced = {} if self.channel_tick_ms is None else {
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(b / "advanced.config")
        }  # fmt: skip
        return {
            **os.environ,
            **advanced,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(b / "mnesia"),
            "RABBITMQ_PID_FILE": str(b / "pid"),
            "RABBITMQ_LOG_BASE": str(b / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(b / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(b / "rabbitmq"),
        }

    def start(self, timeout: float = 60.0) -> None:
        b = self.base
        (b / "mnesia").mkdir(exist_ok=True)
        (b / "log").mkdir(exist_ok=True)
        (b / "enabled_plugins").write_text("[].\n")
        conf = (
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"consumer_timeout = {self.consumer_timeout_ms}\n"
        )
        if self.join is not None:
            # a blank node joins ``join``, trying every half second for two minutes while that
            # one boots too (the list names this node as well: peer discovery locks on the
            # listed nodes and warns when the node itself is not among them)
            conf += (
                "cluster_formation.peer_discovery_backend = classic_config\n"
                f"cluster_formation.classic_config.nodes.1 = {self.join}\n"
                f"cluster_formation.classic_config.nodes.2 = {self.node}\n"
                "cluster_formation.discovery_retry_limit = 240\n"
                "cluster_formation.discovery_retry_interval = 500\n"
            )
        (b / "rabbitmq.conf").write_text(conf)
        if self.channel_tick_ms is not None:
            (b / "advanced.config").write_text(
                f"[{{rabbit, [{{channel_tick_interval, {self.channel_tick_ms}}}]}}].\n"
            )
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(b)], check=True)
        b.chmod(0o755)
        subprocess.run(
            ["rabbitmq-server", "-detached"], env=self.env(), check=True, capture_output=True
        )
        self.started = True
        # ``-detached`` returns before the node registers with epmd, and ``await_startup``
        # fails at once on a node epmd does not know yet: retry until it answers.
        deadline = time.monotonic() + timeout
        while True:
            r = self._run("await_startup", timeout=timeout)
            if r.returncode == 0 and port_open(self.port):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"private RabbitMQ {self.node} did not start:\n{r.stderr[-2000:]}\n"
                    + "\n".join(_tail(p) for p in (b / "log").glob("*.log"))
                )
            time.sleep(0.3)

    def pid(self) -> int:
        """The node's Erlang VM (``RABBITMQ_PID_FILE``, written by each start)."""
        return int((self.base / "pid").read_text().strip())

    def stop(self) -> None:
        """The node and its directories are thrown away: SIGKILL to its VM (``rabbitmqctl
        stop`` would start an Erlang VM of its own for the CLI, and a graceful stop takes
        seconds more)."""
        if self.started:
            try:
                pid = self.pid()
            except (OSError, ValueError):  # no pid file (a start that failed early)
                with contextlib.suppress(Exception):
                    self._run("stop", timeout=60)
            else:
                kill(pid)
            self.started = False
        shutil.rmtree(self.base, ignore_errors=True)

    # ---------------------------------------------------------------- faults and inspection

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["rabbitmqctl", "-q", "-n", self.node, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
        )

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        r = self._run(*args, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {r.stderr.strip()[-1000:]}")
        return r.stdout

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self.ctl("await_startup")

    def app_running(self) -> bool:
        r = self._run("list_queues", "name", timeout=30)
        return r.returncode == 0

    def ensure_running(self) -> None:
        if not self.app_running():
            self.start_app()

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop the broker application (every connection drops, durable queues and persistent
        messages stay on disk) and start it again."""
        self.stop_app()
        time.sleep(down_seconds)
        self.start_app()

    def purge_queue(self, name: str) -> int:
        """Delete every ready message of ``name`` with ``rabbitmqctl``; returns how many were
        ready just before (each ``rabbitmqctl`` call takes ~0.6 s: for an exact count of a
        moving queue use ``harness.purge``)."""
        before = self.queues().get(name, (0, 0, 0))[0]
        self.ctl("purge_queue", name)
        return before

    def close_all_connections(self, reason: str = "fault injection") -> None:
        self.ctl("close_all_connections", reason)

    def queues(self) -> dict[str, tuple[int, int, int]]:
        """name → (ready, unacknowledged, consumers)."""
        out = self.ctl(
            "list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers"
        )
        found: dict[str, tuple[int, int, int]] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[1].isdigit():
                found[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
        return found


class PrivatePostgres:
    """One PostgreSQL 15 cluster of its own (initdb + pg_ctl as ``postgres``)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="conveyor-faults-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "log"
        self.initialised = False
        self.running = False
        self.also_listen: list[str] = []  # addresses beyond 127.0.0.1 (``reach_from``)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _pg(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            ["runuser", "-u", "postgres", "--", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-1000:]}\n"
                + _tail(self.log)
            )
        return r

    def start(self) -> None:
        if not self.initialised:
            subprocess.run(["chown", "postgres:postgres", str(self.base)], check=True)
            self.base.chmod(0o755)
            self._pg(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
            self.initialised = True
        listen = ",".join(["127.0.0.1", *self.also_listen])
        self._pg(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "start",
            "-o", f"-p {self.port} -k {self.base} -c listen_addresses={listen}",
        )  # fmt: skip
        self.running = True

    def reach_from(self, host_ip: str, client_ip: str) -> None:
        """Listen on ``host_ip`` too (the host's end of a ``netns.Link``) and trust
        ``client_ip``; restarts the cluster (``pg_ctl -m fast``) when it runs."""
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {client_ip}/32 trust\n")
        self.also_listen.append(host_ip)
        if self.running:
            self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.running = False
            self.start()

    def unreach(self, host_ip: str) -> None:
        """Stop asking for ``host_ip`` at the next start (its link is gone)."""
        with contextlib.suppress(ValueError):
            self.also_listen.remove(host_ip)

    def crash(self) -> None:
        """``pg_ctl -m immediate``: every backend dies without a checkpoint, as in a crash; the
        next start runs crash recovery."""
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.running = False

    def restart(self, down_seconds: float = 0.0) -> None:
        self.crash()
        time.sleep(down_seconds)
        self.start()

    def processes(self) -> list[int]:
        """The postmaster and its children (backends, checkpointer, ...)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == postmaster:
                    pids.append(int(stat.parent.name))
        return pids

    def freeze(self) -> list[int]:
        """SIGSTOP the whole cluster: connections stay open and nothing answers (a hung server
        or a silent network partition)."""
        pids = self.processes()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def thaw(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.running:
            with contextlib.suppress(Exception):
                self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.running = False
        shutil.rmtree(self.base, ignore_errors=True)

    async def terminate(self, application_name: str, database: str | None = None) -> int:
        """``pg_terminate_backend`` every connection of one component; returns how many."""
        conn = await asyncpg.connect(self.url(), timeout=5)
        try:
            return int(
                await conn.fetchval(
                    """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                       WHERE application_name = $1 AND ($2::text IS NULL OR datname = $2)
                         AND pid <> pg_backend_pid()""",
                    application_name,
                    database,
                )
            )
        finally:
            await conn.close()
