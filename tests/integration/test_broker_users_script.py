"""Issue 13.5: ``deploy/rabbitmq-users.sh`` (``conveyor roles amqp``), the script
docker-compose.yml's ``broker-users`` step runs, executed for real against a RabbitMQ node of
the test's own (user names are node-global): each component's user can log in with its
password and holds its permission patterns; a second run with a new password rotates it
(idempotent: no "user exists" failure); an unset password stops the script before any user is
made."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq
import pytest

from conveyor.broker.permissions import COMPONENTS, permissions, rabbitmqctl_commands

from ..faults.infra import PrivateRabbit

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def node() -> Iterator[PrivateRabbit]:
    rabbit = PrivateRabbit()
    rabbit.start()
    try:
        yield rabbit
    finally:
        rabbit.stop()


def _script(node: PrivateRabbit, tmp_path: Path, passwords: dict[str, str]) -> int:
    path = tmp_path / "rabbitmq-users.sh"
    path.write_text(rabbitmqctl_commands("jobs"))
    env = {k: v for k, v in node.env().items() if not k.startswith("CONVEYOR_")}
    env.update({f"CONVEYOR_{c.upper()}_AMQP_PASSWORD": p for c, p in passwords.items()})
    return subprocess.run(["sh", str(path)], env=env, capture_output=True, timeout=120).returncode


async def _login(node: PrivateRabbit, user: str, password: str) -> None:
    conn = await aio_pika.connect(f"amqp://{user}:{password}@127.0.0.1:{node.port}/", timeout=10)
    await conn.close()


def test_the_deploy_file_is_this_script() -> None:
    root = Path(__file__).resolve().parents[2]
    assert (root / "deploy/rabbitmq-users.sh").read_text() == rabbitmqctl_commands("jobs")


async def test_the_users_script_creates_rotates_and_refuses_unset_passwords(
    node: PrivateRabbit, tmp_path: Path
) -> None:
    passwords = {c: f"pw-{c}-{secrets.token_hex(4)}" for c in COMPONENTS}
    partial = {c: p for c, p in passwords.items() if c != "publisher"}  # the first one
    assert _script(node, tmp_path, partial) != 0
    assert "conveyor_" not in node.ctl("list_users"), "an unset password must create no user"

    assert _script(node, tmp_path, passwords) == 0
    listed = node.ctl("list_permissions", "-p", "/")
    for c in COMPONENTS:
        user = f"conveyor_{c}"
        await _login(node, user, passwords[c])
        with pytest.raises((aiormq.exceptions.ProbableAuthenticationError, ConnectionError)):
            await _login(node, user, "wrong-" + passwords[c])
        conf, write, read = permissions("jobs", c)
        row = next(line.split("\t") for line in listed.splitlines() if line.startswith(user))
        assert row[1:] == [conf, write, read], row

    rotated = {**passwords, "worker": "pw-rotated-" + secrets.token_hex(4)}
    assert _script(node, tmp_path, rotated) == 0, "a second run must not fail on existing users"
    await _login(node, "conveyor_worker", rotated["worker"])
    with pytest.raises((aiormq.exceptions.ProbableAuthenticationError, ConnectionError)):
        await _login(node, "conveyor_worker", passwords["worker"])
