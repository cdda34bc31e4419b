"""How the tests share a pytest-xdist run (``make test``: ``-n 4 --dist loadgroup``).

- ``@pytest.mark.serial``: a test that runs while no other test of the same run does, for
  assertions about time or throughput measured against the machine (a neighbour's jobs/s beside
  an adversary, a drain within its grace). All of them form one xdist group, scheduled last, and
  run as one block under an exclusive lock: a readers-writer lock over the run's workers
  (``flock`` on two files in the run's pytest base directory). Every other test holds the main
  lock shared; the turnstile stops new tests from taking it while the block waits, so the block
  is not starved. A serial run (no xdist) takes no lock.
- A test that uses a module- or class-scoped fixture of the project (a private RabbitMQ node or
  PostgreSQL cluster, the state model's database) gets ``xdist_group(<its module>)``, so that
  fixture is built once, on one worker.
- The tests of ``tests/slow_tests.txt`` are handed out first, longest first, so a long test
  never starts last and holds up the end of the run.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

import pytest

SERIAL_GROUP = "serial"
# Scopes whose fixtures are worth building once per module, not once per worker.
_SHARED_SCOPES = ("module", "class", "package")


def under_xdist() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def is_serial(item: pytest.Item) -> bool:
    return item.get_closest_marker("serial") is not None


# --------------------------------------------------------------------------- scheduling


def _module_group(item: pytest.Item) -> str | None:
    """The module of ``item`` when it uses one of the project's module-scoped fixtures."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for defs in info.name2fixturedefs.values():
        for fd in defs:
            if fd.scope in _SHARED_SCOPES and str(fd.baseid).startswith("tests"):
                return item.nodeid.split("::", 1)[0]
    return None


def _slow_tests() -> dict[str, float]:
    """tests/slow_tests.txt: ``<seconds> <node id>`` per line."""
    known: dict[str, float] = {}
    path = Path(__file__).with_name("slow_tests.txt")
    for line in path.read_text().splitlines() if path.exists() else []:
        seconds, _, nodeid = line.partition(" ")
        if nodeid and not line.startswith("#"):
            known[nodeid] = float(seconds)
    return known


def arrange(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups and order (before xdist's own hook reads the ``xdist_group`` marks)."""
    for item in items:
        if any(item.iter_markers("xdist_group")):
            continue
        group = SERIAL_GROUP if is_serial(item) else _module_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if under_xdist():  # every worker sorts alike: serial last, else longest first
        known = _slow_tests()
        items.sort(key=lambda item: (is_serial(item), -known.get(item.nodeid, 0.0)))
        if config.getvalue("loadgroup"):
            for item in items:
                _name_group(item)


def _name_group(item: pytest.Item) -> None:
    """The group in the node id (``<id>@<group>``), which is all xdist's loadgroup scheduler
    reads. xdist's own hook writes it to ``item._nodeid``; pytest 9 keeps the id in
    ``item._id``, so there it would never arrive and each worker would build the module's
    fixtures again."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})  # fmt: skip
    node_id = getattr(item, "_id", None)
    if names and node_id is not None and "@" not in item.nodeid:
        item._id = type(node_id).parse(f"{item.nodeid}@{'_'.join(names)}")


def keep_collection_order(config: pytest.Config) -> None:
    """xdist would hand out the groups with the most tests first (the serial block among them);
    the order ``arrange`` chose is the one wanted."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# --------------------------------------------------------------------------- the lock


class RunLock:
    """This worker's side of the readers-writer lock."""

    def __init__(self) -> None:
        self.files: tuple[IO[str], IO[str]] | None = None
        self.exclusive = False

    def _open(self, config: pytest.Config) -> tuple[IO[str], IO[str]] | None:
        basetemp = config.option.basetemp  # xdist gives each worker <run's base>/popen-gwN
        if self.files is None and under_xdist() and basetemp:
            where = Path(basetemp).parent
            self.files = ((where / "turnstile").open("a"), (where / "main").open("a"))
        return self.files

    def before(self, item: pytest.Item) -> None:
        files = self._open(item.config)
        if files is None:
            return
        turn, main = files
        if is_serial(item):
            if not self.exclusive:  # the first of the block
                fcntl.flock(turn, fcntl.LOCK_EX)  # no new test starts from now on
                fcntl.flock(main, fcntl.LOCK_EX)  # and the running ones have finished
                self.exclusive = True
        else:
            fcntl.flock(turn, fcntl.LOCK_SH)
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(turn, fcntl.LOCK_UN)

    def after(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if self.files is None:
            return
        turn, main = self.files
        if self.exclusive and nextitem is not None and is_serial(nextitem):
            return  # the block goes on
        fcntl.flock(main, fcntl.LOCK_UN)
        fcntl.flock(turn, fcntl.LOCK_UN)
        self.exclusive = False


LOCK = RunLock()
