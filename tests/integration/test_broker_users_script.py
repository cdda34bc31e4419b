"""``deploy/rabbitmq-users.sh`` (``conveyor roles amqp``), the script
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
    for unset in ("publisher", "sweeper"):  # the first user's, and the last one's
        partial = {c: p for c, p in passwords.items() if c != unset}
        assert _script(node, tmp_path, partial) != 0
    # one listing after both (no run deletes a user; each rabbitmqctl run is an Erlang VM)
    assert "conveyor_" not in node.ctl("list_users"), "publisher or sweeper unset: no user at all"

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


def _exists(path: Path) -> bool:
    return path.exists()


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


async def test_awkward_passwords_are_set_exactly(node: PrivateRabbit, tmp_path: Path) -> None:
    """A password that starts with a dash, holds quotes, a backslash, a dollar sign, a command
    substitution or Unicode is set exactly as given, never parsed as an option nor run by a
    shell (Debian's rabbitmqctl wrapper, run as root, passes its arguments through ``sh -c``),
    when the user is created and when it is rotated. One rabbitmqctl would cut (white space at
    either end, a line break) is refused before any user is made."""
    marker = Path(f"/tmp/conveyor-injected-{secrets.token_hex(4)}")
    awkward = {
        "publisher": "-starts-with-a-dash",
        "worker": f'it\'s "q" \\ $HOME `id` $(touch {marker}) %s caf\u00e9',
        "sweeper": "--help",
    }
    try:
        for round_ in ("create", "rotate"):
            passwords = {c: p + ("" if round_ == "create" else "-2") for c, p in awkward.items()}
            assert _script(node, tmp_path, passwords) == 0, round_
            for c, password in passwords.items():
                user = f"conveyor_{c}"
                try:
                    conn = await aio_pika.connect(
                        host="127.0.0.1", port=node.port, login=user, password=password,
                        timeout=10,
                    )  # fmt: skip
                    await conn.close()
                except (aiormq.exceptions.ProbableAuthenticationError, ConnectionError) as exc:
                    pytest.fail(f"{round_}: {user} cannot log in with its password: {exc!r}")
            assert not _exists(marker), "a password was run as a shell command"
    finally:
        _remove(marker)
    node.ctl("delete_user", "conveyor_worker")
    cuts = (" leading", "trailing\t", "two\nlines")
    for cut in cuts:
        assert _script(node, tmp_path, {**awkward, "worker": cut}) != 0, repr(cut)
    # one listing after the three (no run deletes a user)
    assert "conveyor_worker" not in node.ctl("list_users"), f"one of {cuts!r} made the user"
