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
