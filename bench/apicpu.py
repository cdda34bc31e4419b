"""The API process alone, per submitted job: CPU seconds, or instructions under callgrind (the
one repeatable figure on a shared machine). Compares checkouts of the submit path side by side:
``python -m bench.apicpu /work/wt-old /work/wt-perf --rounds 3``.

For each checkout, in turn and repeated (old, new, old, new, ...): a fresh database, that
checkout's ``conveyor migrate`` and (when it has it) ``conveyor types register``, then its
``conveyor api`` alone (no relay, no worker: the outbox only grows). It warms up, then sends
``--rest`` single submits over ``--connections`` keep-alive connections and ``--batches``
batches of ``--batch-size`` (2 in flight), and reads the API process's CPU around each phase.

- ``--callgrind DIR``: the API runs under ``valgrind --tool=callgrind`` with collection off;
  each phase is counted alone (``callgrind_control``) and reported as instructions per job
  (``rest_ir_per_job``, ``batch_ir_per_job``); ``callgrind_annotate DIR/<file>`` for the C-level
  breakdown. Use ``--connections 4`` (it runs ~50x slower; the DB timeout is raised to 60 s).
- ``--pyspy DIR``: py-spy's raw stacks of the measured phases.
- ``--profile DIR``: the API under cProfile (``python -m cProfile -o``), written on exit.
- ``--log-level warning``: without the per-request access log, to see its cost."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import psutil

from .loadgen import RawClient

SERVER = os.environ.get("CONVEYOR_BENCH_SERVER", "postgresql://postgres@127.0.0.1:5432/postgres")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _recreate(name: str) -> str:
    conn = await asyncpg.connect(SERVER)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return SERVER.rsplit("/", 1)[0] + "/" + name


async def _drop(name: str) -> None:
    conn = await asyncpg.connect(SERVER)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _many(client: RawClient, path: str, bodies: list[bytes]) -> None:
    async def one(body: bytes) -> None:
        status, data = await client.post(path, body)
        if status != 201:
            raise RuntimeError(f"{path}: {status} {data[:200]!r}")

    await asyncio.gather(*(one(b) for b in bodies))


def _collect(opts: argparse.Namespace, pid: int, on: bool, jobs: int = 0) -> int | None:
    """Under ``--callgrind``: start counting, or stop, dump and return instructions per job."""
    if not opts.callgrind:
        return None
    if on:
        subprocess.run(["callgrind_control", "--zero", str(pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
        return None
    subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    files = sorted(Path(opts.callgrind).glob(f"*.{pid}.*"), key=lambda p: p.stat().st_mtime)
    for line in files[-1].read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1]) // max(jobs, 1)
    return None


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


async def measure(
    checkout: Path, opts: argparse.Namespace, label: str, round_: int = 0
) -> dict[str, Any]:
    db = f"conveyor_apicpu_{label}"
    url = await _recreate(db)
    conveyor = str(checkout / ".venv" / "bin" / "conveyor")
    python = str(checkout / ".venv" / "bin" / "python")
    # CONVEYOR_RUN_DUTIES: the API's own CPU, no relay in it (docs/architecture.md)
    env = {**os.environ, "CONVEYOR_DATABASE_URL": url, "CONVEYOR_NAMESPACE": f"apicpu{label}",
           "PYTHONPATH": str(checkout), "CONVEYOR_LOG_LEVEL": opts.log_level,
           "CONVEYOR_AUTH": os.environ.get("CONVEYOR_AUTH", "disabled"),
           "CONVEYOR_RUN_DUTIES": "false"}  # fmt: skip
    run = dict(env=env, cwd=checkout, capture_output=True, text=True, timeout=120)
    subprocess.run([conveyor, "migrate"], check=True, **run)  # type: ignore[call-overload]
    subprocess.run([conveyor, "types", "register", "--app", "bench.app:router"], **run)  # type: ignore[call-overload]
    port = _free_port()
    argv = [conveyor, "api", "--port", str(port), *opts.api_args]
    if opts.callgrind:
        env["CONVEYOR_DB_TIMEOUT"] = "60"  # ~50x slower under valgrind: no 503 for that
        cg = Path(opts.callgrind)
        os.makedirs(cg, exist_ok=True)
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={cg}/{label}-r{round_}.%p", python, *argv]  # fmt: skip
    elif opts.profile:
        out = Path(opts.profile) / f"{label}.prof"
        os.makedirs(out.parent, exist_ok=True)
        argv = [python, "-m", "cProfile", "-o", str(out), conveyor, *argv[1:]]
    log = open(f"/tmp/apicpu-{label}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(argv, env=env, cwd=checkout, stdout=log, stderr=log,
                            start_new_session=True)  # fmt: skip
    try:
        client = RawClient(f"http://127.0.0.1:{port}", opts.connections)
        for _ in range(3000 if opts.callgrind else 300):
            try:
                if (await client.get("/healthz"))[0] == 200:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.1)
        ps = psutil.Process(proc.pid)
        single = orjson.dumps({"type": "noop", "payload": {}})
        batch = orjson.dumps({"jobs": [{"type": "noop", "payload": {}}] * opts.batch_size})
        await _many(client, "/jobs", [single] * 300)  # warm-up
        await _many(client, "/jobs/batch", [batch] * 2)
        out: dict[str, Any] = {"label": label}
        spy = None
        if opts.pyspy:
            path = Path(opts.pyspy) / f"{label}-r{round_}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(proc.pid),
                 "--format", "raw", "--rate", "250", "--nonblocking", "--output", str(path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.sleep(1.0)
        if opts.rest:
            _collect(opts, proc.pid, True)
            c0, w0 = _cpu(ps), time.perf_counter()
            await _many(client, "/jobs", [single] * opts.rest)
            c1, w1 = _cpu(ps), time.perf_counter()
            out["rest_ir_per_job"] = _collect(opts, proc.pid, False, opts.rest)
            out["rest_cpu_ms_per_job"] = round(1000 * (c1 - c0) / opts.rest, 3)
            out["rest_jobs_per_s"] = round(opts.rest / (w1 - w0))
        if opts.batches:
            bclient = RawClient(f"http://127.0.0.1:{port}", 2)
            _collect(opts, proc.pid, True)
            c0, w0 = _cpu(ps), time.perf_counter()
            await _many(bclient, "/jobs/batch", [batch] * opts.batches)
            c1, w1 = _cpu(ps), time.perf_counter()
            n = opts.batches * opts.batch_size
            out["batch_ir_per_job"] = _collect(opts, proc.pid, False, n)
            out["batch_cpu_ms_per_job"] = round(1000 * (c1 - c0) / n, 4)
            out["batch_jobs_per_s"] = round(n / (w1 - w0))
            await bclient.close()
        await client.close()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        return out
    finally:
        proc.send_signal(signal.SIGINT if opts.profile else signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        await _drop(db)


async def main(opts: argparse.Namespace) -> None:
    results: list[dict[str, Any]] = []
    for r in range(opts.rounds):
        for i, checkout in enumerate(opts.checkouts):
            label = f"{Path(checkout).name.replace('-', '_')}_{i}"
            res = await measure(Path(checkout), opts, label, r)
            res["round"] = r
            print(orjson.dumps(res).decode(), flush=True)
            results.append(res)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.apicpu", description=__doc__)
    p.add_argument("checkouts", nargs="+", help="checkouts, each with its .venv")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rest", type=int, default=2000)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--log-level", default="info")
    p.add_argument("--profile", help="directory for cProfile output")
    p.add_argument("--callgrind", help="directory: count the API's instructions (valgrind)")
    p.add_argument("--pyspy", help="directory for py-spy raw stacks of the measured phases")
    p.add_argument("--api-args", nargs="*", default=[], help="extra `conveyor api` arguments")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
