"""A second host for real partitions: a network namespace joined to this one by a veth pair
(root and ``ip`` only). Processes started through ``exec_prefix`` reach the host's services at
``host_ip`` with their own kernel's TCP; ``down()`` takes the namespace's end of the link down,
so nothing answers and nothing resets: the servers' side of each connection sees silence until
its own keepalives, ``tcp_user_timeout`` or application heartbeats give up. ``up()`` restores
the link (the namespace's address and route come back with it).

Unlike ``proxy.py``'s blackhole, no socket on the host answers for the partitioned peer: the
server's TCP keepalives are what end its sessions.

Every name carries a random tag (namespace ``cvg<tag>``, links ``vgh<tag>``/``vgn<tag>``) and
a random /30 in 10.234.0.0/16, so concurrent tests and runs never share one; ``close()``
deletes both and is safe to call twice, after a failed ``create()`` too."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
import uuid
from pathlib import Path


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Link:
    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns, self.host_if, self.ns_if = f"cvg{tag}", f"vgh{tag}", f"vgn{tag}"
        base = random.randrange(0, 1 << 16, 4)  # a /30 of 10.234.0.0/16
        self.host_ip = f"10.234.{base >> 8}.{(base & 0xFF) + 1}"
        self.ns_ip = f"10.234.{base >> 8}.{(base & 0xFF) + 2}"
        self.is_down = False
        self.created = False

    def create(self) -> Link:
        self.created = True
        ip("netns", "add", self.ns)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        ip("link", "set", self.ns_if, "netns", self.ns)
        ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        ip("-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        ip("-n", self.ns, "link", "set", self.ns_if, "up")
        ip("-n", self.ns, "link", "set", "lo", "up")
        return self

    def exec_prefix(self) -> list[str]:
        """Prepended to a command, runs it in the namespace (``ip netns exec`` execs it: the
        pid is the command's own, so signals reach it)."""
        return ["ip", "netns", "exec", self.ns]

    def down(self) -> None:
        ip("-n", self.ns, "link", "set", self.ns_if, "down")
        self.is_down = True

    def up(self) -> None:
        ip("-n", self.ns, "link", "set", self.ns_if, "up")
        self.is_down = False

    def close(self) -> None:
        """Delete the link and the namespace (a process still inside keeps neither alive)."""
        if not self.created:
            return
        self.created = False
        for args in (("link", "del", self.host_if), ("netns", "del", self.ns)):
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                ip(*args)

    def __enter__(self) -> Link:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()


# What a PostgreSQL backend logs when a session ends, by cause (default ``log_line_prefix``
# ``%m [%p] ``): the server's TCP bounds (keepalives, ``tcp_user_timeout``) end a vanished
# client's session with a receive or send error, ``idle_in_transaction_session_timeout`` with a
# FATAL of its own.
_LINE = re.compile(r"\[(\d+)\] (?:LOG|FATAL|ERROR):\s+(.*)")
ENDINGS = (
    ("keepalive", ("could not receive data from client", "could not send data to client",
                   "connection to client lost")),
    ("idle_bound", ("idle-in-transaction timeout",)),
    ("statement_bound", ("statement timeout",)),
)  # fmt: skip


def session_endings(log: Path, offset: int = 0) -> dict[int, str]:
    """pid → why its session ended (``ENDINGS``' first word), from the server log after
    ``offset`` bytes; pids whose end the log does not explain are absent."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return {}
    found: dict[int, str] = {}
    for m in _LINE.finditer(text):
        pid, message = int(m.group(1)), m.group(2)
        for cause, words in ENDINGS:
            if pid not in found and any(w in message for w in words):
                found[pid] = cause
    return found


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0
