"""Subprocesses of a benchmark run: start with a log file, watch, stop (always), and sample their
memory. Every process gets its own session, so stopping one stops its children too (Celery's
prefork pool) and a Ctrl-C in the terminal reaches only the harness, which then stops them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil


class ServiceDied(RuntimeError):
    pass


class Service:
    """One long-running subprocess whose stdout and stderr go to ``log``."""

    def __init__(
        self, name: str, argv: Sequence[str], env: dict[str, str], cwd: Path, log: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        """Raise ``ServiceDied`` (with the end of its log) when the process has exited."""
        code = self.proc.poll()
        if code is not None:
            raise ServiceDied(f"{self.name} exited with code {code}\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        body = "\n".join(f"  | {line}" for line in text)
        return f"last lines of {self.log}:\n{body}"

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM the process group, wait ``grace`` seconds, then SIGKILL. Returns the exit code
        (negative: killed by that signal)."""
        if self.alive():
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        if self.alive():
            self._signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        else:  # the leader is gone; make sure no child of it survives
            self._signal(signal.SIGKILL)
        self._out.close()
        return self.proc.returncode

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes."""
    total = 0
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return 0
    for p in _tree(root):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


class RssSampler:
    """A thread that samples the resident memory of registered process trees and keeps each
    one's peak (the sum over the tree at one instant, maximised over the samples)."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.peak: dict[str, int] = {}
        self._pids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self._pids[name] = pid

    def forget(self, name: str) -> None:
        with self._lock:
            pid = self._pids.pop(name, None)
        if pid is not None:
            self._sample(name, pid)

    def reset(self, name: str) -> None:
        """Forget ``name``'s peak (a service of that name is about to start afresh)."""
        with self._lock:
            self.peak.pop(name, None)

    def peak_mb(self, name: str) -> float | None:
        with self._lock:
            value = self.peak.get(name)
        return None if value is None else round(value / 2**20, 1)

    def _sample(self, name: str, pid: int) -> None:
        rss = tree_rss(pid)
        with self._lock:
            if rss > self.peak.get(name, 0):
                self.peak[name] = rss

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                pids = dict(self._pids)
            for name, pid in pids.items():
                self._sample(name, pid)


def listener_pid(port: int) -> int | None:
    """The process listening on a local TCP port (the PostgreSQL postmaster, the RabbitMQ node),
    so private test clusters on other ports are not counted as the benchmark's."""
    with contextlib.suppress(psutil.Error):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    return None


def _busy_cpu() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


class CpuMeter:
    """CPU seconds spent per role between ``start()`` and ``stop()``: our services (with their
    children), the PostgreSQL and RabbitMQ servers, the load generators, the harness, and
    ``other``: everything else on the machine (another test run, say), which makes a noisy
    measurement visible. On a small machine this shows which process is the bottleneck."""

    def __init__(self, roles: Callable[[], dict[str, int]], servers: dict[str, int | None]) -> None:
        self.roles = roles  # asked at both ends: a service started in between counts from zero
        self.servers = servers
        self._before: dict[int, float] = {}
        self._busy = 0.0
        self._started = 0.0

    def _snapshot(self) -> dict[int, tuple[str, float]]:
        out: dict[int, tuple[str, float]] = {}
        me = psutil.Process()
        t = me.cpu_times()
        out[me.pid] = ("harness", t.user + t.system)  # itself only: the services are its children
        trees = {**self.roles(), **{k: v for k, v in self.servers.items() if v is not None}}
        for role, pid in trees.items():
            with contextlib.suppress(psutil.Error):
                for p in _tree(psutil.Process(pid)):
                    with contextlib.suppress(psutil.Error):
                        t = p.cpu_times()
                        out.setdefault(p.pid, (role, t.user + t.system))
        return out

    def start(self) -> CpuMeter:
        self._before = {pid: cpu for pid, (_, cpu) in self._snapshot().items()}
        self._busy = _busy_cpu()
        self._started = time.monotonic()
        return self

    def stop(self, extra: Iterable[tuple[str, float]] = ()) -> dict[str, float]:
        """Per-role CPU seconds since ``start``, plus ``extra`` (role, seconds) pairs measured
        elsewhere, ``other`` and ``wall`` seconds."""
        totals: dict[str, float] = {}
        for pid, (role, cpu) in self._snapshot().items():
            totals[role] = totals.get(role, 0.0) + cpu - self._before.get(pid, 0.0)
        for role, cpu in extra:
            totals[role] = totals.get(role, 0.0) + cpu
        totals["other"] = max(0.0, _busy_cpu() - self._busy - sum(totals.values()))
        totals["wall"] = time.monotonic() - self._started
        return {k: round(v, 2) for k, v in totals.items()}
