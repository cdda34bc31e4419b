"""Container health checks for Conveyor's image, standard library only (the slim image has no curl).

python /opt/conveyor/healthcheck.py http://127.0.0.1:8000/healthz
    exit 0 when the URL answers 2xx within 3 s (the API's and the worker's endpoints).

python /opt/conveyor/healthcheck.py --amqp-connected
    exit 0 when this container holds an established TCP connection to the port of
    CONVEYOR_AMQP_URL. For the publisher, which serves no HTTP endpoint: it keeps one broker
    connection open for as long as it relays, so a missing connection means the relay is not
    running or RabbitMQ is unreachable. Probes should allow ~60 s of failures before a
    restart (the same grace a worker gives its broker connection).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
ESTABLISHED = "01"
DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}


def http_ok(url: str, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def amqp_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or DEFAULT_PORTS.get(parts.scheme, 5672)


def established_remote_ports(tables: Iterable[str]) -> set[int]:
    """Remote ports of ESTABLISHED connections in /proc/net/tcp-formatted text."""
    ports: set[int] = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == ESTABLISHED:
                ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def _read_tables() -> list[str]:
    tables = []
    for path in TCP_TABLES:
        try:
            with open(path) as f:
                tables.append(f.read())
        except OSError:
            continue  # no IPv6 in this container
    return tables


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "--amqp-connected":
        port = amqp_port(os.environ.get("CONVEYOR_AMQP_URL", "amqp://127.0.0.1:5672/"))
        ok = port in established_remote_ports(_read_tables())
        if not ok:
            print(f"no established connection to the broker port {port}", file=sys.stderr)
        return 0 if ok else 1
    ok = http_ok(argv[0])
    if not ok:
        print(f"{argv[0]} did not answer 2xx", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
