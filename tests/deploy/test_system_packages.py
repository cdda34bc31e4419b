"""The README's `make test` sets up a fresh machine itself: it runs `.ci/system-packages` first,
which installs the Debian packages the tests need when they are missing (as root, with apt-get)
or says in one line what to install; `.ci/run` is little more than starting the services and
`make test`. A missing package is simulated by a PATH without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "system-packages"
NEEDED = ["prometheus", "chromium", "chromium-driver"]  # promtool, chromium, chromedriver


def _bin(tmp_path: Path, *tools: str) -> Path:
    """A directory with only ``tools`` (links to the real ones): every other command the script
    looks for is missing, but for what /usr/sbin holds (pgbouncer, rabbitmq-server)."""
    directory = tmp_path / "bin"
    directory.mkdir()
    for tool in ("bash", "mktemp", "tail", "rm", *tools):
        found = shutil.which(tool)
        assert found, tool
        (directory / tool).symlink_to(found)
    return directory


def test_make_test_installs_the_system_packages_before_it_tests() -> None:
    plan = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout.splitlines()
    steps = [line for line in plan if ".ci/system-packages" in line or "pytest" in line]
    assert steps and ".ci/system-packages" in steps[0] and "pytest" in steps[-1], plan
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "apt-get" not in ci


def test_nothing_missing_is_silent() -> None:
    done = subprocess.run([SCRIPT], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_missing_packages_without_root_are_one_line() -> None:
    with tempfile.TemporaryDirectory() as tmp:  # not under pytest's 0700 base: another user runs it
        Path(tmp).chmod(0o755)
        # a copy the other user can read: the clone may be private (0700, /root)
        script = Path(tmp) / "system-packages"
        shutil.copyfile(SCRIPT, script)
        script.chmod(0o755)
        _missing_packages_are_one_line(_bin(Path(tmp), "kubectl", "apt-get"), script)


def _missing_packages_are_one_line(path: Path, script: Path) -> None:
    command = [str(path / "bash"), str(script)]
    if os.geteuid() == 0:  # as a user who cannot install
        command = [
            str(shutil.which("setpriv")),
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            *command,
        ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={"PATH": str(path)}
    )
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1, done.stderr
    line = done.stderr.strip()
    assert all(f" {p} " in line or line.endswith(f" {p}") for p in NEEDED), line
    assert "sudo apt-get install prometheus" in line, line


def test_missing_packages_as_root_are_installed_with_apt_get(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the install path runs as root only")
    path = _bin(tmp_path, "kubectl")
    calls = tmp_path / "calls"
    apt = path / "apt-get"  # records what it was asked, installs nothing
    apt.write_text(f'#!{shutil.which("bash")}\necho "$*" >> {calls}\n')
    apt.chmod(0o755)
    done = subprocess.run(
        [path / "bash", SCRIPT], capture_output=True, text=True, timeout=60, env={"PATH": str(path)}
    )
    assert done.returncode == 0, done.stderr
    update, install = calls.read_text().splitlines()
    assert update == "update -q"
    assert install.startswith("install -y -q ") and all(p in install.split() for p in NEEDED)
    assert "installing the system packages the tests need: prometheus" in done.stderr
