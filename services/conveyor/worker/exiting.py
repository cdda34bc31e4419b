"""Leaving the worker process for good, whatever its handlers left behind.

After the drain (``drain.py``) every job the worker held has its outcome written or was handed
back, and a late write from anything still running is fenced. What may remain is not the
worker's to wait for: a handler's non-daemon thread (the interpreter would join it at exit), a
thread stuck in C code, a handler's child process (which inherited every descriptor, the
probes' listening socket included, so a restarted worker could not bind its port). So
``cmd_worker`` ends with ``hard_exit``: kill the worker's descendants, flush, ``os._exit``.

``adopt_orphans`` (at start) makes the worker a child subreaper (Linux): a handler's process that
double-forks stays the worker's descendant, so it is found and killed too.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time

from ..core import tracing

_PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Orphaned descendants are re-parented to this process, not to init. False off Linux."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int | None = None) -> list[int]:
    """Every live descendant of ``pid`` (this process by default), from ``/proc``."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rsplit(b")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def kill_descendants(wait: float = 2.0) -> int:
    """SIGKILL every descendant and reap them (their descriptors are closed once they are
    reaped or re-parented). Returns how many were killed."""
    victims = descendants()
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
    return len(victims)


def hard_exit(code: int) -> None:
    """Kill the descendants, flush the spans, the logs and the standard streams, exit at once
    (no join of the threads that remain; ``os._exit`` runs no ``atexit`` hook)."""
    with contextlib.suppress(Exception):
        kill_descendants()
    with contextlib.suppress(Exception):
        tracing.flush()
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
