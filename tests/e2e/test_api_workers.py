"""``conveyor api --workers N``: N processes accepting on one port. Real
processes over real HTTP: each worker serves on its own while the others are frozen (SIGSTOP),
and one SIGTERM to the parent stops every worker and the parent, exit status 0."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conveyor.core.config import Settings

from ..stack import free_port

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` that are uvicorn workers (multiprocessing's spawn), not
    its resource tracker."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
            if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmdline:
                out.append(int(stat.parent.name))
    return sorted(out)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _serves(port: int, n: int = 3) -> bool:
    """``n`` readiness checks, each on a new connection (the kernel hands each to whichever
    worker accepts it), all answered 200."""
    for _ in range(n):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=3) as c:
            if (await c.get("/readyz")).status_code != 200:
                return False
    return True


def _started(log: Path) -> int:
    """Processes that logged ``api_started`` (a line names the event twice: ``api_started
    action="api_started"``, so count lines, not occurrences)."""
    return sum("api_started" in line for line in log.read_text().splitlines())


@pytest.mark.timeout(120)
async def test_api_workers_each_serve_and_stop_together_on_sigterm(
    settings: Settings, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "CONVEYOR_DATABASE_URL": settings.database_url,
        "CONVEYOR_AMQP_URL": settings.amqp_url,
        "CONVEYOR_NAMESPACE": settings.namespace,
    }
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "api", "--port", str(port), "--workers", "2"],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            workers = _children(proc.pid)
            if len(workers) == 2 and _started(log) == 2:
                break
            await asyncio.sleep(0.2)
        assert len(workers) == 2 and _started(log) == 2, log.read_text()
        assert await _serves(port)

        for alone in workers:  # each worker answers by itself while the other is frozen
            others = [w for w in workers if w != alone]
            for w in others:
                os.kill(w, signal.SIGSTOP)
            try:
                served = await _serves(port)
            finally:
                for w in others:
                    os.kill(w, signal.SIGCONT)
            assert served, f"worker {alone} did not serve alone"
        assert _children(proc.pid) == workers  # none was replaced meanwhile

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not any(_alive(w) for w in workers), "a worker outlived the parent"
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=3) as c:
                await c.get("/healthz")
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)
