"""``@pytest.mark.serial``: a test that runs while no other test of the same run does.

For tests whose assertions are about time or throughput measured against the machine (a
neighbour's jobs/s beside an adversary, a drain within its grace): under pytest-xdist the other
workers' tests would load the same two cores. A readers-writer lock over the run's workers
(``flock`` on two files in the run's pytest base directory): every test holds the main lock
shared, a ``serial`` test holds it exclusively; the turnstile stops new tests from taking the
shared lock while a serial test waits, so it is not starved. A serial run takes no lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def lock_dir(config: pytest.Config) -> Path | None:
    """The run's base temporary directory (xdist gives each worker ``<it>/popen-gwN``)."""
    basetemp = config.option.basetemp
    if not os.environ.get("PYTEST_XDIST_WORKER") or not basetemp:
        return None
    return Path(basetemp).parent


@contextlib.contextmanager
def run_lock(config: pytest.Config, *, exclusive: bool) -> Iterator[None]:
    where = lock_dir(config)
    if where is None:
        yield
        return
    with (where / "turnstile").open("a") as turn, (where / "main").open("a") as main:
        if exclusive:
            fcntl.flock(turn, fcntl.LOCK_EX)  # no new test starts from now on
            fcntl.flock(main, fcntl.LOCK_EX)  # and the running ones have finished
        else:
            fcntl.flock(turn, fcntl.LOCK_SH)
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(main, fcntl.LOCK_UN)
            fcntl.flock(turn, fcntl.LOCK_UN)
