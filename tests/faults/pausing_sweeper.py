"""``conveyor sweeper`` that freezes itself inside the schedules transaction: run as
``python -m tests.faults.pausing_sweeper FLAG``. Once the file FLAG exists, the next schedules
pass deletes it and sends itself SIGSTOP just before moving ``next_run_at`` on: the process is
frozen with the transaction open, its tick jobs inserted and the schedule row locked (``idle in
transaction``), like a VM pause or a long GC. The test sends SIGCONT. The fault is a wrapper put
on the store class in this process only; the sweeper itself is the production one."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conveyor import cli
from conveyor.store.schedules import Advance, ScheduleStatements


def _take(flag: Path) -> bool:
    """True once: when ``flag`` exists (it is deleted)."""
    try:
        flag.unlink()
    except FileNotFoundError:
        return False
    return True


def main(flag: Path) -> int:
    advance = ScheduleStatements.schedule_advance

    async def pausing(self: ScheduleStatements, conn: Any, items: Sequence[Advance]) -> None:
        if _take(flag):  # a microsecond's unlink: not worth a thread
            os.kill(os.getpid(), signal.SIGSTOP)
        await advance(self, conn, items)

    ScheduleStatements.schedule_advance = pausing  # type: ignore[method-assign]
    return cli.main(["sweeper"])


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
