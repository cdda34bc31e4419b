"""One job's failure is its own: the duties that settle jobs in batches (the worker's outcome
writes, the sweeper's lease recovery) isolate it, so the rest of its batch goes on.

A failed statement is one of two kinds:

- the server or the session failed (no answer: a connection lost, a timeout on the client's
  side, which cannot tell a slow statement from a half-open connection; or an answer about the
  server: shutting down, too many connections, the session's idle bound): every job of the
  batch would fail alike, so the batch is tried again whole. So are the deployment's refusals
  (a missing privilege or table): an operator cures those, for every job alike;
- the server refused the statement for something of its rows (``concerns_rows``): a trigger's
  error, a lock held elsewhere past the lock bound, the statement bound passed, a deadlock, a
  value it cannot store. Tried again whole, the batch would fail the same way for as long as
  that one job's cause lasts, and every job beside it would wait. The duty settles the others
  without it and sets it aside (``Aside``): it is tried again alone after 1 s, then after twice
  as long at each failure, at most 60 s, and logged with its id at each failure.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from .backoff import ceiling

# SQLSTATE classes of failures that are not a statement's rows': connection exception (08),
# invalid transaction state (25: the session's idle bound ended it), insufficient resources
# (53), operator intervention (57: a shutdown, "cannot connect now"; but not 57014), system
# error (58), internal error (XX); and the deployment's refusals: a privilege or an object the
# schema lacks (42), an unknown database or schema (3D, 3F).
_NOT_THE_ROWS = frozenset({"08", "25", "53", "57", "58", "XX", "42", "3D", "3F"})

# The bounds a statement may pass (SQLSTATE: which bound): a lock waited for past
# ``lock_timeout`` and a statement ended at ``statement_timeout`` (57014, "query canceled").
BOUNDS = {"55P03": "lock", "57014": "statement"}

FIRST_WAIT = 1.0
LONGEST_WAIT = 60.0


def _sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else None


def bound_passed(exc: BaseException) -> str | None:
    """Which of the server's bounds ended the statement ("lock", "statement"), else None."""
    state = _sqlstate(exc)
    return BOUNDS.get(state) if state is not None else None


def concerns_rows(exc: BaseException) -> bool:
    """True when the server refused the statement for something of its rows, so that the
    same statement without one of its jobs may succeed (see the module's docstring)."""
    if isinstance(exc, UnicodeError):  # a value that cannot be encoded for the server
        return True
    state = _sqlstate(exc)
    if state is None:  # no answer from the server
        return False
    return state in BOUNDS or state[:2] not in _NOT_THE_ROWS


class Aside:
    """Jobs set aside after failing alone, each with the time of its next try: ``FIRST_WAIT``
    after its first failure, doubled at each failure up to ``LONGEST_WAIT``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._jobs: dict[uuid.UUID, tuple[int, float]] = {}  # failures, time of the next try

    def failed(self, job_id: uuid.UUID) -> float:
        """Set ``job_id`` aside after one more failure; returns its wait."""
        failures = self._jobs.get(job_id, (0, 0.0))[0] + 1
        wait = ceiling(failures, FIRST_WAIT, LONGEST_WAIT)
        self._jobs[job_id] = (failures, self.clock() + wait)
        return wait

    def settled(self, job_id: uuid.UUID) -> None:
        """``job_id`` went through (or no longer needs its duty): nothing holds it back now."""
        self._jobs.pop(job_id, None)

    def held(self) -> list[uuid.UUID]:
        """Every job set aside, its wait over or not."""
        return list(self._jobs)

    def due(self) -> list[uuid.UUID]:
        """The jobs set aside whose wait is over."""
        now = self.clock()
        return [job_id for job_id, (_, at) in self._jobs.items() if at <= now]
