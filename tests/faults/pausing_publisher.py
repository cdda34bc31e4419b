"""A publisher process that freezes itself inside its relay transaction.

``python -m tests.faults.pausing_publisher`` (from the repository root, settings from the
``CONVEYOR_*`` environment) runs the real relay, its publisher wrapped from outside: the first
batch it takes SIGSTOPs the process before publishing, with the batch's outbox rows deleted in
its open transaction (their locks held), like a frozen VM or a long GC pause. After SIGCONT it
publishes that batch (stale by then: duplicates the worker's claim must drop) and carries on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from conveyor.broker import LIBRARY_LOGGERS
from conveyor.core.config import Settings
from conveyor.core.logging import configure
from conveyor.publisher.relay import Relay


def say(text: str) -> None:
    sys.stderr.write(f"pausing_publisher: {text}\n")
    sys.stderr.flush()


def freeze_once(relay: Relay) -> Relay:
    publish_batch = relay.publisher.publish_batch
    frozen = False

    async def wrapped(rows: Any, *args: Any) -> list[BaseException | None]:
        nonlocal frozen
        if not frozen:
            frozen = True
            say(f"frozen holding {len(rows)} rows")
            os.kill(os.getpid(), signal.SIGSTOP)
            say("resumed")
        return await publish_batch(rows, *args)

    relay.publisher.publish_batch = wrapped  # type: ignore[method-assign]
    return relay


async def main() -> None:
    relay = freeze_once(Relay(Settings()))
    await relay.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    say("started")
    try:
        await relay.run(stop)
    finally:
        await relay.close()


if __name__ == "__main__":
    configure(quiet=(*LIBRARY_LOGGERS, "alembic"))
    asyncio.run(main())
