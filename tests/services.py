"""Where the tests find PostgreSQL and RabbitMQ.

Order: the environment (``CONVEYOR_TEST_DATABASE_URL`` / ``CONVEYOR_TEST_AMQP_URL``, else the
local defaults) when reachable; else testcontainers when a Docker engine is available; else the
run fails with a message saying how to start them. Never a silent skip: a test that needs a
service and cannot get it fails, in CI and locally alike.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 1
        ):
            return True
    except OSError:
        return False


def docker_available() -> bool:
    return os.path.exists("/var/run/docker.sock") or bool(os.environ.get("DOCKER_HOST"))


@dataclass
class Endpoints:
    database_url: str  # the maintenance database (postgres); tests create their own
    amqp_url: str
    containers: list[object]


def locate() -> Endpoints:
    db = os.environ.get("CONVEYOR_TEST_DATABASE_URL", DEFAULT_DB)
    amqp = os.environ.get("CONVEYOR_TEST_AMQP_URL", DEFAULT_AMQP)
    containers: list[object] = []
    db_ok, amqp_ok = reachable(db, 5432), reachable(amqp, 5672)
    if (not db_ok or not amqp_ok) and docker_available():
        if not db_ok:
            from testcontainers.postgres import PostgresContainer

            pg = PostgresContainer("postgres:15", driver=None).start()
            containers.append(pg)
            db = pg.get_connection_url().replace("postgresql+psycopg2://", "postgresql://")
            db_ok = True
        if not amqp_ok:
            from testcontainers.rabbitmq import RabbitMqContainer

            rmq = RabbitMqContainer("rabbitmq:3.10-management").start()
            containers.append(rmq)
            amqp = f"amqp://guest:guest@{rmq.get_container_host_ip()}:{rmq.get_exposed_port(5672)}/"
            amqp_ok = True
    missing = []
    if not db_ok:
        missing.append(
            f"PostgreSQL at {db} (start it: pg_ctlcluster --skip-systemctl-redirect "
            "$(ls /etc/postgresql) main start)"
        )
    if not amqp_ok:
        missing.append(f"RabbitMQ at {amqp} (start it: rabbitmq-server -detached)")
    if missing:
        raise RuntimeError(
            "the test suite needs real services and found none reachable and no Docker engine "
            "for testcontainers: " + "; ".join(missing)
        )
    return Endpoints(db, amqp, containers)
