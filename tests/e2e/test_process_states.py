"""Every long-running command as a real process, in each state it can be in: a port it needs is
taken (one line naming the fix, a non-zero exit within seconds, nothing left running), starting
while PostgreSQL cannot be reached, running, draining; SIGTERM and SIGINT end it in each."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.core.config import Settings

from ..stack import free_port

ROOT = Path(__file__).resolve().parents[2]
CONVEYOR = [sys.executable, "-m", "conveyor.cli"]
SIGNALS = [signal.SIGTERM, signal.SIGINT]
DOWN = "postgresql://postgres@127.0.0.1:1/conveyor"  # nothing listens on port 1

pytestmark = pytest.mark.timeout(120)


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "CONVEYOR_DATABASE_URL": settings.database_url,
        "CONVEYOR_AMQP_URL": settings.amqp_url,
        "CONVEYOR_NAMESPACE": settings.namespace,
        "CONVEYOR_AUTH": "disabled",
        **extra,
    }


def _command(name: str, port: int) -> list[str]:
    """``name``'s arguments with ``port`` as its listening (or probe) port."""
    return {
        "dev": ["dev", "--app", "tests.apps:router", "--port", str(port)],
        "api": ["api", "--port", str(port)],
        "api-workers": ["api", "--port", str(port), "--workers", "2"],
        "worker": ["worker", "--app", "tests.apps:router", "--health-port", str(port)],
        "publisher": ["publisher", "--health-port", str(port)],
        "sweeper": ["sweeper", "--health-port", str(port)],
    }[name]


class Proc:
    """A conveyor process whose stderr is read as it comes (the pipe never fills)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.lines.append(line.decode())

    async def wait_for_line(self, match: Callable[[str], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(match(line) for line in self.lines):
            assert self.proc.returncode is None, "exited early:\n" + "".join(self.lines)
            assert time.monotonic() < deadline, "never logged it:\n" + "".join(self.lines)
            await asyncio.sleep(0.05)

    async def ends_within(self, seconds: float) -> int:
        try:
            code = await asyncio.wait_for(self.proc.wait(), seconds)
        except TimeoutError:
            raise AssertionError(
                f"still running {seconds} s later:\n" + "".join(self.lines[-20:])
            ) from None
        await self._reader
        return code


@contextlib.asynccontextmanager
async def conveyor(args: list[str], env: dict[str, str]) -> AsyncIterator[Proc]:
    proc = await asyncio.create_subprocess_exec(
        *CONVEYOR, *args, env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield Proc(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    """A port another process's socket listens on (on every address)."""
    with socket.socket() as other:
        other.bind(("0.0.0.0", 0))
        other.listen()
        yield other.getsockname()[1]


@pytest.mark.parametrize("name", ["dev", "api", "api-workers", "worker", "publisher", "sweeper"])
async def test_a_port_in_use_is_one_line_and_a_non_zero_exit(settings: Settings, name: str) -> None:
    with busy_port() as port:
        async with conveyor(_command(name, port), _env(settings)) as proc:
            code = await proc.ends_within(15)
    assert code == 2, proc.lines
    assert len(proc.lines) == 1, proc.lines
    line = proc.lines[0]
    flag = "--port" if name in ("dev", "api", "api-workers") else "--health-port"
    assert f"port {port} " in line and "in use" in line and flag in line, line
    assert ("make dev PORT=" in line) == (name == "dev"), line


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("name", ["dev", "api", "worker", "publisher", "sweeper"])
async def test_a_signal_stops_a_running_command(
    settings: Settings, name: str, sig: signal.Signals
) -> None:
    port = free_port()
    async with conveyor(_command(name, port), _env(settings)) as proc:
        url = f"http://127.0.0.1:{port}/healthz"
        async with httpx.AsyncClient() as client:
            deadline = time.monotonic() + 60
            while True:
                assert proc.proc.returncode is None, "".join(proc.lines)
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(url)).status_code == 200:
                        break
                assert time.monotonic() < deadline, "".join(proc.lines)
                await asyncio.sleep(0.1)
        proc.proc.send_signal(sig)
        assert await proc.ends_within(20) == 0, proc.lines
    assert_no_traceback(proc.lines)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("name", ["worker", "publisher", "sweeper"])
async def test_a_signal_stops_a_command_waiting_for_the_database(
    settings: Settings, name: str, sig: signal.Signals
) -> None:
    env = _env(settings, CONVEYOR_DATABASE_URL=DOWN)
    async with conveyor(_command(name, free_port()), env) as proc:
        await proc.wait_for_line(lambda line: "start_failed" in line or "_failed" in line)
        proc.proc.send_signal(sig)
        await proc.ends_within(10)
    assert_no_traceback(proc.lines)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("name", ["worker", "publisher"])
async def test_a_signal_stops_a_command_whose_broker_never_answers(
    settings: Settings, name: str, sig: signal.Signals
) -> None:
    """A broker port that accepts connections and says nothing: the start hangs in the
    client's connect; a signal ends it there at once, exit 0, no traceback."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.setblocking(False)
        port = silent.getsockname()[1]
        env = _env(settings, CONVEYOR_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{port}/")
        async with conveyor(_command(name, free_port()), env) as proc:
            # its connect is waiting for the broker's first frame once the "broker" accepted it
            # (a start-up takes seconds on a loaded machine: wait for the connection, not a time)
            accepted = []
            for _ in range(600):
                with contextlib.suppress(BlockingIOError):
                    accepted.append(silent.accept()[0])
                    break
                await asyncio.sleep(0.05)
            assert accepted, proc.lines
            await asyncio.sleep(0.3)
            assert proc.proc.returncode is None, proc.lines
            proc.proc.send_signal(sig)
            code = await proc.ends_within(3)
            for conn in accepted:
                conn.close()
    assert code == 0, proc.lines
    assert_no_traceback(proc.lines)


@pytest.mark.parametrize("name", ["worker", "dev"])
async def test_a_second_signal_ends_a_draining_command_at_once(
    settings: Settings, name: str
) -> None:
    """SIGTERM drains (the running job may take its 60 s grace); SIGINT then ends it now."""
    port = free_port()
    env = _env(settings, CONVEYOR_SHUTDOWN_GRACE="60")
    async with contextlib.AsyncExitStack() as stack:
        if name == "worker":  # its jobs come through a separate API
            api_port = free_port()
            await stack.enter_async_context(conveyor(_command("publisher", free_port()), env))
            api = await stack.enter_async_context(conveyor(_command("api", api_port), env))
            await api.wait_for_line(lambda line: "api_started" in line)
        else:
            api_port = port
        proc = await stack.enter_async_context(conveyor(_command(name, port), env))
        await proc.wait_for_line(lambda line: "worker_started" in line)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}") as client:
            for _ in range(200):
                with contextlib.suppress(httpx.TransportError):
                    r = await client.post(
                        "/jobs", json={"type": "slow", "payload": {"seconds": 60}}
                    )
                    break
                await asyncio.sleep(0.1)
            assert r.status_code == 201, r.text
            job = r.json()["id"]
            for _ in range(300):
                if (await client.get(f"/jobs/{job}")).json()["status"] == "IN_PROGRESS":
                    break
                await asyncio.sleep(0.1)
        proc.proc.send_signal(signal.SIGTERM)
        await proc.wait_for_line(lambda line: "worker_draining" in line, timeout=10)
        await asyncio.sleep(0.5)
        assert proc.proc.returncode is None, "the drain did not wait for the running job"
        proc.proc.send_signal(signal.SIGINT)
        code = await proc.ends_within(5)
    assert code == 128 + signal.SIGINT, proc.lines
    assert any("stopped_without_draining" in line for line in proc.lines), proc.lines


async def _make_dev(settings: Settings, port: int) -> asyncio.subprocess.Process:
    """``make dev PORT=port`` in a process group of its own, as a terminal runs it."""
    return await asyncio.create_subprocess_exec(
        "make", "--no-print-directory", "dev", f"PORT={port}", env=_env(settings), cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_make_dev_on_a_port_in_use_names_the_make_variable(settings: Settings) -> None:
    with busy_port() as port:
        make = await _make_dev(settings, port)
        try:
            out, _ = await asyncio.wait_for(make.communicate(), 30)
        finally:  # a hung run must not outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(make.pid, signal.SIGKILL)
    assert make.returncode != 0
    assert f"port {port} " in out.decode() and "make dev PORT=" in out.decode(), out


@pytest.mark.parametrize("to", ["make", "group"])
async def test_make_dev_ends_on_a_signal(settings: Settings, to: str) -> None:
    """SIGTERM to make (make passes it on to `conveyor dev`), or SIGINT to the process group (what
    Ctrl-C in a terminal sends): nothing of it keeps running."""
    port = free_port()
    make = await _make_dev(settings, port)
    try:
        async with httpx.AsyncClient() as client:
            deadline = time.monotonic() + 60
            while True:
                assert make.returncode is None
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                        break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        if to == "make":
            make.send_signal(signal.SIGTERM)
        else:
            os.killpg(make.pid, signal.SIGINT)
        await asyncio.wait_for(make.communicate(), 20)
        for _ in range(100):
            if _group_gone(make.pid):
                break
            await asyncio.sleep(0.1)
        assert _group_gone(make.pid), "conveyor dev outlived make"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(make.pid, signal.SIGKILL)


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.3, 0.5, 0.8])
async def test_ctrl_c_while_the_command_is_still_starting(settings: Settings, delay: float) -> None:
    """Ctrl-C a moment after typing ``conveyor dev`` (the installed script, while Python is
    still importing): the command ends quietly, never with a ``KeyboardInterrupt`` traceback
    (it printed one of up to 40 lines until the first signal handler was in place)."""
    script = str(Path(sys.executable).parent / "conveyor")
    proc = await asyncio.create_subprocess_exec(
        script, *_command("dev", free_port()), env=_env(settings), cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await asyncio.sleep(delay)
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), 10)
        except TimeoutError:  # the interpreter lost it (below): Ctrl-C again, as anyone would
            proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    err = _without_a_lost_interrupt(err)
    if proc.returncode == 1 and err.startswith(b"Fatal Python error: init_"):
        return  # the interpreter's own start-up was interrupted: before any code of ours ran
    if proc.returncode == -signal.SIGINT and _only_the_installers_wrapper(err.decode(), script):
        return  # interrupted in the installer's wrapper, before our entry module's first line
    # -SIGINT: ended by the signal before Python was up, as any program is
    assert proc.returncode in (0, 130, -signal.SIGINT), (proc.returncode, err.decode())
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode()


# A SIGINT that lands while importlib runs a module lock's weakref callback raises there, and
# Python ignores an exception raised in a callback: it prints it and goes on, the interrupt lost
# (rare: about one early interrupt in a few hundred). Interpreter code, before any of ours.
_LOST = re.compile(
    rb"Exception ignored in: <function _get_module_lock\.[^\n]*>\n"
    rb"Traceback \(most recent call last\):\n"
    rb'(?:  File "<frozen importlib\._bootstrap>", line \d+, in \w+\n)+'
    rb"KeyboardInterrupt:? ?\n"
)


def _without_a_lost_interrupt(err: bytes) -> bytes:
    return _LOST.sub(b"", err, count=1)


def _only_the_installers_wrapper(err: str, script: str) -> bool:
    """A ``KeyboardInterrupt`` traceback whose frames are all the script pip writes (``import re,
    sys`` then ``from conveyor_cli import main``) and the import machinery finding that module:
    the signal came before the first statement of ``conveyor_cli``, which installs the quiet
    handler. No code of Conveyor's can run earlier; on a loaded machine a Ctrl-C 0.05 s after the
    start can land there."""
    frames = re.findall(r'^  File "([^"]+)", line (\d+)', err, flags=re.MULTILINE)
    try:
        lines = Path(script).read_text().splitlines()
    except OSError:
        return False

    def before_ours(file: str, line: str) -> bool:
        if file.startswith("<frozen "):
            return True
        # the wrapper's own frames only on its import lines: a frame on ``sys.exit(main())``
        # alone means main() had run and returned, our code ran, and that is no excuse
        n = int(line)
        return (
            file == script and 0 < n <= len(lines) and lines[n - 1].startswith(("import ", "from "))
        )

    return (
        err.startswith("Traceback (most recent call last):")
        and err.rstrip().endswith("KeyboardInterrupt")
        and bool(frames)
        and all(before_ours(f, n) for f, n in frames)
    )


def _wrapper_traceback(script: str, *frames: tuple[str, int]) -> str:
    shown = "".join(f'  File "{f}", line {n}, in <module>\n' for f, n in frames)
    return f"Traceback (most recent call last):\n{shown}KeyboardInterrupt\n"


def test_only_a_signal_before_our_entry_module_is_excused() -> None:
    """The excuse covers a Ctrl-C on the wrapper's import lines (before ``conveyor_cli`` ran),
    not one on its ``sys.exit(main())`` line: a traceback with only that frame means ``main()``
    had already run and returned (our code ran, and the signal still printed a traceback)."""
    script = str(Path(sys.executable).parent / "conveyor")
    lines = Path(script).read_text().splitlines()
    imp = next(i for i, t in enumerate(lines, 1) if t.startswith("from conveyor_cli import"))
    call = next(i for i, t in enumerate(lines, 1) if "main()" in t)
    frozen = ("<frozen importlib._bootstrap>", 1176)
    assert _only_the_installers_wrapper(_wrapper_traceback(script, (script, imp), frozen), script)
    ours = (str(ROOT / "services" / "conveyor_cli.py"), 11)
    assert not _only_the_installers_wrapper(
        _wrapper_traceback(script, (script, imp), frozen, ours), script
    )
    assert not _only_the_installers_wrapper(_wrapper_traceback(script, (script, call)), script)


def test_only_an_interrupt_lost_in_importlibs_callback_is_removed() -> None:
    lost = (
        b"Exception ignored in: <function _get_module_lock.<locals>.cb at 0x7f3a2c1b2e80>\n"
        b"Traceback (most recent call last):\n"
        b'  File "<frozen importlib._bootstrap>", line 445, in cb\n'
        b"KeyboardInterrupt: \n"
    )
    assert _without_a_lost_interrupt(lost) == b""
    assert _without_a_lost_interrupt(b"x\n" + lost + b"y\n") == b"x\ny\n"
    ours = lost.replace(b"<frozen importlib._bootstrap>", b"/srv/conveyor/cli/main.py")
    assert _without_a_lost_interrupt(ours) == ours  # a frame of ours: not the interpreter's


def assert_no_traceback(lines: list[str]) -> None:
    """The process printed no traceback; a failure shows the first one whole (the lines before
    it say what the process was doing)."""
    at = next((i for i, line in enumerate(lines) if "Traceback" in line), None)
    assert at is None, "".join(lines[max(0, at - 5) :])
