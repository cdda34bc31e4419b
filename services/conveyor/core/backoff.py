"""Reconnect pacing for background loops."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with full jitter: 0.1 s, 0.2 s, ... capped at ``cap``."""

    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return random.uniform(0, min(self.cap, self.base * 2 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0
