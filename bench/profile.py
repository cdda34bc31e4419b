"""``--profile``: py-spy samples the Conveyor services during each workload (``pip install
py-spy``). Raw collapsed stacks land in ``bench/results/profiles/<workload>-<service>.txt`` (feed
them to speedscope or flamegraph.pl); the harness prints each one's hottest functions."""

from __future__ import annotations

import collections
import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def record(spy: str, pids: dict[str, int], out: Path, workload: str) -> Iterator[list[Path]]:
    """Sample each of ``pids`` until the block ends; yields the files being written."""
    out.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    files: list[Path] = []
    for name, pid in pids.items():
        path = out / f"{workload}-{name}.txt"
        argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "100",
                "--nonblocking", "--output", str(path)]  # fmt: skip
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        files.append(path)
    try:
        yield files
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def hottest(path: Path, top: int = 8) -> list[tuple[float, str]]:
    """The functions with the most samples in their subtree (excluding the event loop's own
    frames), as (percent of samples, frame)."""
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        for frame in set(stack.split(";")):
            inclusive[frame] += n
    skip = ("runpy", "asyncio/", "uvloop/", "<module>", "conveyor/cli.py", "services.py",
            "threading.py", "concurrent/futures")  # fmt: skip
    ranked = [(f, n) for f, n in inclusive.most_common() if not any(s in f for s in skip)]
    return [(round(100 * n / total, 1), f) for f, n in ranked[:top]] if total else []
