"""``make help`` is the first thing a newcomer runs: every target it lists is one the Makefile has,
and what it prints is what the target does (the dev port, not the variable's name)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _help(*args: str) -> str:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "help", *args],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip


def test_help_lists_the_targets_with_their_values() -> None:
    out = _help()
    targets = re.findall(r"^  make (\S+)", out, re.M)
    assert {"install", "dev", "test", "bench"} <= set(targets), out
    assert "$(" not in out, out
    assert "http://127.0.0.1:8000" in out


def test_help_shows_the_port_asked_for() -> None:
    assert "http://127.0.0.1:9123" in _help("PORT=9123")


def _plan(target: str, venv: Path) -> list[str]:
    """What ``make <target>`` would run in a fresh clone (no virtualenv yet)."""
    return subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(ROOT), target, f"VENV={venv}"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.splitlines()  # fmt: skip


def test_make_dev_installs_what_running_needs_not_the_test_tools(tmp_path: Path) -> None:
    """``make dev`` on a fresh clone installs Conveyor alone (699 MB with the test tools:
    Playwright, schemathesis, MkDocs, testcontainers...); ``make test`` adds them."""
    venv = tmp_path / "venv"
    dev = [line for line in _plan("dev", venv) if "pip install" in line]
    assert dev and not any("[test" in line for line in dev), dev
    assert any(line.rstrip().endswith("-e .") for line in dev), dev
    test = [line for line in _plan("test", venv) if "pip install" in line]
    assert any("'.[test]'" in line for line in test), test
