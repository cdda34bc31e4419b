"""When the holder of the duties gives them up (``cli/duties.py``), with an injected clock: a
start that fails or a relay that stops reaching the services for ``give_up`` seconds, never a
start that was merely slow."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from conveyor.cli.duties import Duties
from conveyor.core.config import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _holder(clock: Clock, *, relay_ok: float, running_since: float | None) -> Duties:
    duties = Duties(Settings(), give_up=30.0, clock=clock)
    duties.state, duties._held_since = "holder", 900.0
    if running_since is not None:
        duties.running, duties._running_since = True, running_since
        relay: Any = SimpleNamespace(last_ok=relay_ok)
        sweeper: Any = SimpleNamespace(live=lambda: (True, {}))
        duties.relay, duties.sweeper = relay, sweeper
    return duties


def test_a_holder_that_never_started_gives_up_after_the_delay() -> None:
    clock = Clock()
    assert _holder(clock, relay_ok=0, running_since=None)._failing(clock.now)  # held 100 s
    clock.now = 920.0
    assert not _holder(clock, relay_ok=0, running_since=None)._failing(clock.now)


def test_a_slow_start_is_no_failure() -> None:
    """The relay was built (its clock set) 60 s before its start succeeded: just running."""
    clock = Clock()
    assert not _holder(clock, relay_ok=940.0, running_since=999.0)._failing(clock.now)


def test_a_relay_that_stopped_reaching_the_services_gives_up() -> None:
    clock = Clock()
    assert _holder(clock, relay_ok=960.0, running_since=950.0)._failing(clock.now)
    assert not _holder(clock, relay_ok=990.0, running_since=950.0)._failing(clock.now)
