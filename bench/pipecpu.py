"""The publisher and the worker, per job: instructions under callgrind (repeatable on a shared
machine) or CPU seconds. The counterpart of ``bench.apicpu`` for the rest of the pipeline:
``python -m bench.pipecpu /work/old282 /work/wt-perf --callgrind /tmp/cg``.

For each checkout, in turn: a fresh database, that checkout's ``conveyor migrate`` and (when it
has it) ``conveyor types register``, then its ``conveyor publisher --no-maintenance`` and
``conveyor worker --app bench.app:router --concurrency 128`` (under valgrind with collection off
when ``--callgrind``). Jobs are inserted directly (job + outbox row, ``pg_notify``), as the
benchmark's relay step does. After a warm-up, two phases, each counted alone:

- ``lone``: ``--lone`` jobs one at a time, the next inserted when the last is COMPLETED: a claim,
  an outcome and a publish per job (the REST workload's small batches at their smallest).
  Reports ``worker_lone`` and ``publisher_lone`` per job.
- ``drain``: ``--drain`` jobs inserted without outbox rows, locked (``FOR UPDATE``) by the tool's
  own transaction, then their outbox rows: the publisher relays them all (``publisher_row``)
  while the worker's first claim waits for the lock. Counting on the worker starts there and the
  lock is released: the worker drains a full queue (``worker_drain``), as in the drain step. The
  first prefetch's deliveries arrived before counting (the same for every checkout).

``--callgrind DIR`` keeps the dumps (``callgrind_annotate DIR/<file>``); without it the figures
are CPU milliseconds per job (psutil). First ``--idle`` seconds are counted with nothing to do:
``<figure>_net`` is the figure less that idle rate over the phase's wall time (under valgrind
everything takes ~50x longer, so timers and polls weigh ~50x more per job than at full speed).
``--pyspy DIR``: py-spy's raw stacks of each counted phase (``<label>-<service>-<n>.txt``, in
the order idle, lone, relay or drain); ``--profile DIR``: each service under cProfile for the
whole run (``<label>-<service>.prof``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import psutil

from . import broker
from .apicpu import _drop, _recreate

AMQP = os.environ.get("CONVEYOR_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
SCHEMA = "conveyor"
INSERT_JOBS = """
INSERT INTO jobs (id, job_type, status, priority, payload)
SELECT gen_random_uuid(), 'noop', 'PENDING', 5, '{}'::jsonb FROM generate_series(1, $1)
RETURNING id
"""
INSERT_OUTBOX = """
INSERT INTO job_outbox (job_id, job_type, priority)
SELECT id, 'noop', 5 FROM unnest($1::uuid[]) AS id
"""
NOTIFY = "SELECT pg_notify('conveyor_outbox', '')"
COMPLETED = "SELECT count(*) FROM jobs WHERE status = 'COMPLETED' AND id = ANY($1)"
OUTBOX_EMPTY = "SELECT NOT EXISTS (SELECT 1 FROM job_outbox)"
WAITING = """SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'"""


class Proc:
    """A service, optionally under callgrind with collection off."""

    def __init__(self, name: str, argv: list[str], opts: argparse.Namespace, label: str,
                 env: dict[str, str], cwd: Path) -> None:  # fmt: skip
        self.name, self.opts = name, opts
        if opts.profile:
            out = str(Path(opts.profile) / f"{label}-{name}.prof")
            argv = [argv[0], "-m", "cProfile", "-o", out, *argv[1:]]
        elif opts.callgrind:
            out = f"--callgrind-out-file={opts.callgrind}/{label}-{name}.%p"
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", out, *argv]
        self.log = open(f"/tmp/pipecpu-{label}-{name}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self.log, stderr=self.log,
                                     start_new_session=True)  # fmt: skip
        self.ps = psutil.Process(self.proc.pid)
        self.cpu0 = self.wall0 = self.seconds = 0.0
        self.spy: subprocess.Popen[bytes] | None = None
        self.label, self.phase = label, 0

    def _ctl(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True,
                       capture_output=True)  # fmt: skip

    def start(self) -> None:
        if self.opts.callgrind:
            self._ctl("--zero")
            self._ctl("-i", "on")
        if self.opts.pyspy:
            self.phase += 1
            path = Path(self.opts.pyspy) / f"{self.label}-{self.name}-{self.phase}.txt"
            self.spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                 str(self.proc.pid), "--format", "raw", "--rate", "500", "--nonblocking",
                 "--output", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(0.5)
        t = self.ps.cpu_times()
        self.cpu0 = t.user + t.system
        self.wall0 = time.monotonic()

    def stop(self, jobs: int) -> float:
        """Instructions (or CPU ms) per job since ``start``; ``self.seconds``: the wall time."""
        self.seconds = time.monotonic() - self.wall0
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)
            self.spy.wait(30)
            self.spy = None
        if not self.opts.callgrind:
            t = self.ps.cpu_times()
            return round(1000 * (t.user + t.system - self.cpu0) / jobs, 4)
        self._ctl("-i", "off")
        self._ctl("--dump")
        files = Path(self.opts.callgrind).glob(f"*-{self.name}.{self.proc.pid}.*")
        last = max(files, key=lambda p: p.stat().st_mtime)
        for line in last.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1]) // jobs
        raise RuntimeError(f"no totals in {last}")

    def close(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


async def _connect(url: str) -> asyncpg.Connection:
    """Unqualified names: Conveyor's schema first (an old checkout's tables are in public)."""
    return await asyncpg.connect(url, server_settings={"search_path": f"{SCHEMA}, public"})


async def _until(conn: asyncpg.Connection, query: str, *args: Any, want: Any = True,
                 timeout: float = 600.0) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout
    while await conn.fetchval(query, *args) != want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{query.split()[0:6]} != {want}")
        await asyncio.sleep(0.02)


async def _one(conn: asyncpg.Connection) -> None:
    async with conn.transaction():
        ids = [r["id"] for r in await conn.fetch(INSERT_JOBS, 1)]
        await conn.execute(INSERT_OUTBOX, ids)
        await conn.execute(NOTIFY)
    await _until(conn, COMPLETED, ids, want=1)


def _net(out: dict[str, Any], idle: dict[str, float], p: Proc, key: str, jobs: int) -> None:
    """``<key>_net``: less what the process spends idle in as long (its timers and polls)."""
    if p.name in idle:
        out[key + "_net"] = round(out[key] - idle[p.name] * p.seconds / jobs, 4)


async def measure(checkout: Path, opts: argparse.Namespace, label: str) -> dict[str, Any]:
    url = await _recreate(f"conveyor_pipecpu_{label}_{os.getpid()}")
    python = str(checkout / ".venv" / "bin" / "python")
    conveyor = str(checkout / ".venv" / "bin" / "conveyor")
    ns = f"pipecpu{label}{os.getpid()}"
    # CONVEYOR_RUN_DUTIES: the publisher relays, not the worker (docs/architecture.md)
    env = {**os.environ, "CONVEYOR_DATABASE_URL": url, "CONVEYOR_NAMESPACE": ns,
           "PYTHONPATH": str(checkout), "CONVEYOR_LOG_LEVEL": opts.log_level,
           "CONVEYOR_DB_TIMEOUT": "120", "CONVEYOR_DB_SCHEMA": SCHEMA,
           "CONVEYOR_RUN_DUTIES": "false"}  # fmt: skip
    run = dict(env=env, cwd=checkout, capture_output=True, text=True, timeout=120)
    subprocess.run([conveyor, "migrate"], check=True, **run)  # type: ignore[call-overload]
    subprocess.run([conveyor, "types", "register", "--app", "bench.app:router"], **run)  # type: ignore[call-overload]
    conn = await _connect(url)
    procs: list[Proc] = []
    out: dict[str, Any] = {"label": label}
    try:
        pub = Proc("publisher", [python, conveyor, "publisher", "--no-maintenance"], opts, label,
                   env, checkout)  # fmt: skip
        procs.append(pub)
        wrk = Proc("worker", [python, conveyor, "worker", "--app", "bench.app:router",
                              "--concurrency", "128"], opts, label, env, checkout)  # fmt: skip
        procs.append(wrk)
        for _ in range(opts.warmup):
            await _one(conn)
        idle: dict[str, float] = {}
        if opts.idle:  # what the timers cost per second (valgrind stretches time ~50x)
            for p in procs:
                p.start()
            await asyncio.sleep(opts.idle)
            for p in procs:
                idle[p.name] = p.stop(1) / p.seconds
        pub.start()
        wrk.start()
        for _ in range(opts.lone):
            await _one(conn)
        out["publisher_lone"] = pub.stop(opts.lone)
        out["worker_lone"] = wrk.stop(opts.lone)
        _net(out, idle, pub, "publisher_lone", opts.lone)
        _net(out, idle, wrk, "worker_lone", opts.lone)

        ids = [r["id"] for r in await conn.fetch(INSERT_JOBS, opts.drain)]
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM jobs WHERE id = ANY($1) FOR UPDATE", ids)
            other = await _connect(url)
            try:
                pub.start()
                async with other.transaction():
                    await other.execute(INSERT_OUTBOX, ids)
                    await other.execute(NOTIFY)
                await _until(other, OUTBOX_EMPTY)
                out["publisher_row"] = pub.stop(opts.drain)
                _net(out, idle, pub, "publisher_row", opts.drain)
                await _until(other, WAITING, want=1)
                wrk.start()
            finally:
                await other.close()
        await _until(conn, COMPLETED, ids, want=opts.drain)
        out["worker_drain"] = wrk.stop(opts.drain)
        _net(out, idle, wrk, "worker_drain", opts.drain)
        return out
    finally:
        for p in reversed(procs):
            p.close()
        await conn.close()
        await _drop(f"conveyor_pipecpu_{label}_{os.getpid()}")
        q = [f"{ns}.queue.noop", f"{ns}.dead_letter.queue"]
        x = [f"{ns}.exchange", f"{ns}.retry", f"{ns}.dead_letter"]
        await broker.delete(AMQP, q, x)


async def main(opts: argparse.Namespace) -> None:
    for d in (opts.callgrind, opts.pyspy, opts.profile):
        if d:
            os.makedirs(d, exist_ok=True)
    for r in range(opts.rounds):
        for i, checkout in enumerate(opts.checkouts):
            label = f"{Path(checkout).name.replace('-', '_')}_{i}_r{r}"
            print(orjson.dumps(await measure(Path(checkout), opts, label)).decode(), flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.pipecpu", description=__doc__)
    p.add_argument("checkouts", nargs="+", help="checkouts, each with its .venv")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warmup", type=int, default=20, help="lone jobs before counting")
    p.add_argument("--lone", type=int, default=100)
    p.add_argument("--drain", type=int, default=2000)
    p.add_argument(
        "--idle",
        type=float,
        default=10.0,
        help="seconds counted idle first: each figure's _net subtracts that rate",
    )
    p.add_argument("--log-level", default="info")
    p.add_argument("--callgrind", help="directory: count instructions (valgrind)")
    p.add_argument("--profile", help="directory: the services under cProfile (written at exit)")
    p.add_argument("--pyspy", help="directory for py-spy raw stacks of each counted phase")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
