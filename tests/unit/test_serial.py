"""The xdist groups of ``tests/serial.py`` hold under ``-n 2 --dist loadgroup``: the tests of a
module that uses a module-scoped fixture of the project run on one worker, so the fixture (a
private PostgreSQL cluster, a RabbitMQ node) is built once, not once per worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
import pytest
from tests import serial

def pytest_configure(config):
    serial.keep_collection_order(config)

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    serial.arrange(config, items)
"""

MODULE = """
import os
import pytest

@pytest.fixture(scope="module")
def shared():
    with open({out!r}, "a") as f:
        f.write("built\\n")

@pytest.mark.parametrize("i", range(6))
def test_grouped(shared, i):
    with open({out!r}, "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


def test_a_module_fixture_is_built_once_on_one_worker(tmp_path: Path) -> None:
    out = tmp_path / "seen.txt"
    (tmp_path / "tests").mkdir()
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "tests" / "test_grouped.py").write_text(MODULE.format(out=str(out)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path / "tests")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = out.read_text().split()
    assert lines.count("built") == 1, lines
    assert len({w for w in lines if w != "built"}) == 1, lines
