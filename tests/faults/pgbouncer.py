"""A private PgBouncer in transaction pooling (RECIPES.md): its own ini on a free port, in front
of the shared PostgreSQL (or any ``host:port``). Debian's pgbouncer refuses to run as root: it
runs as ``postgres``, its files readable by that user.

``users``: the login names PgBouncer accepts besides ``postgres`` (trust: any password), each
pooled on server connections made as that same user; ``server_user``: every server connection
is made as this one user instead (``user=`` in the ``[databases]`` entry), whoever the client
logged in as."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .infra import _tail, free_port, port_open


class PrivatePgBouncer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5432,
        *,
        pool_size: int = 20,
        users: Sequence[str] = (),
        server_user: str | None = None,
    ) -> None:
        self.upstream = (host, port)
        self.pool_size = pool_size
        self.users = ["postgres", *users]
        self.server_user = server_user
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="conveyor-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, database: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PrivatePgBouncer:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer is not installed (apt-get install -y pgbouncer)")
        b = self.base
        (b / "users.txt").write_text("".join(f'"{u}" ""\n' for u in self.users))
        host, port = self.upstream
        forced = f" user={self.server_user}" if self.server_user else ""
        (b / "pgb.ini").write_text(
            f"""[databases]
* = host={host} port={port}{forced}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
auth_type = trust
auth_file = {b}/users.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 400
default_pool_size = {self.pool_size}
unix_socket_dir =
logfile = {b}/pgb.log
pidfile = {b}/pgb.pid
ignore_startup_parameters = extra_float_digits
"""
        )
        subprocess.run(["chown", "-R", "postgres", str(b)], check=True)
        b.chmod(0o755)
        # not -d: a child of the test, so it dies with a failed test's reaper too
        self.proc = subprocess.Popen(
            [binary, "-u", "postgres", str(b / "pgb.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("pgbouncer did not start:\n" + _tail(b / "pgb.log"))
            time.sleep(0.05)
        return self

    def show(self, what: str) -> str:
        """``SHOW <what>`` on the admin console (simple query protocol: psql)."""
        return subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-At",
             "-F", "|", "pgbouncer", "-c", f"SHOW {what}"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
            if self.proc.poll() is None:
                self.proc.kill()
        shutil.rmtree(self.base, ignore_errors=True)
