"""What a process says when RabbitMQ will not have it: a wrong password is an authentication
failure naming the user and the broker's host (not "cannot reach … start it"), and a worker or a
publisher retrying its start names the host it tries. The password never appears."""

from __future__ import annotations

import pytest
from yarl import URL

from conveyor.broker.cluster import connect
from conveyor.core.config import Settings

from ..stack import free_port
from .test_process_states import _command, _env, conveyor

pytestmark = pytest.mark.timeout(120)

SECRET = "not-the-password"


def _wrong_password(settings: Settings) -> tuple[str, str]:
    """``settings``' broker URL with a wrong password, and its ``host:port``."""
    url = URL(settings.amqp_url)
    return str(url.with_password(SECRET)), f"{url.host}:{url.port}"


async def test_a_wrong_password_names_the_user_and_the_host(settings: Settings) -> None:
    url, where = _wrong_password(settings)
    user = URL(url).user
    with pytest.raises(Exception) as caught:
        await connect(url, name="test", timeout=5)
    said = str(caught.value)
    assert "authentication failed" in said and f"'{user}'" in said and where in said, said
    assert SECRET not in said


async def test_dev_says_authentication_failed_not_start_it(settings: Settings) -> None:
    url, where = _wrong_password(settings)
    args = _command("dev", free_port())
    async with conveyor(args, _env(settings, CONVEYOR_AMQP_URL=url)) as proc:
        code = await proc.ends_within(30)
    assert code == 2 and len(proc.lines) == 1, proc.lines
    line = proc.lines[0]
    assert "authentication failed" in line and where in line, line
    assert "Start it" not in line and "Cannot reach" not in line and SECRET not in line, line


@pytest.mark.parametrize("name", ["worker", "publisher"])
@pytest.mark.parametrize("fault", ["refused", "password"])
async def test_a_start_retrying_the_broker_names_its_host(
    settings: Settings, name: str, fault: str
) -> None:
    if fault == "password":
        url, where = _wrong_password(settings)
    else:
        port = free_port()  # nothing listens there
        url, where = f"amqp://guest:{SECRET}@127.0.0.1:{port}/", f"127.0.0.1:{port}"
    env = _env(settings, CONVEYOR_AMQP_URL=url)
    async with conveyor(_command(name, free_port()), env) as proc:
        await proc.wait_for_line(lambda line: f"{name}_start_failed" in line)
        line = next(line for line in proc.lines if f"{name}_start_failed" in line)
        assert where in line and SECRET not in line, line
        if fault == "password":
            assert "authentication failed" in line, line
