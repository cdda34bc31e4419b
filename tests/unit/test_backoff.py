"""The reconnect pacing of every background loop (``core/backoff.py``)."""

from __future__ import annotations

from conveyor.core.backoff import Backoff, ceiling


def test_the_ladder_doubles_up_to_its_cap() -> None:
    assert [ceiling(n, 0.5, 10) for n in (1, 2, 3, 5, 6)] == [0.5, 1, 2, 8, 10]


def test_an_outage_of_any_length_keeps_a_bounded_wait() -> None:
    # a loop failing once every few seconds reaches a thousand failures within the hour
    backoff = Backoff(base=0.1, cap=5.0)
    waits = [backoff.next() for _ in range(5000)]
    assert all(0 <= w <= 5.0 for w in waits)
    assert ceiling(10**6, 1.0, 60.0) == 60.0
