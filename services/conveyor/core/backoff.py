"""Reconnect pacing for background loops, and the one exponential ladder they climb."""

from __future__ import annotations

import random


def ceiling(failures: int, base: float, cap: float) -> float:
    """The longest wait after ``failures`` failures in a row: ``base``, doubled per failure,
    at most ``cap``. The exponent stops at 64 (2.0 ** 1024 is no float: an outage of a thousand
    failures would otherwise raise OverflowError in the loop waiting it out)."""
    return min(cap, base * 2.0 ** min(failures - 1, 64))


class Backoff:
    """Exponential backoff with full jitter: 0.1 s, 0.2 s, ... capped at ``cap``."""

    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return random.uniform(0, ceiling(self.failures, self.base, self.cap))

    def reset(self) -> None:
        self.failures = 0
