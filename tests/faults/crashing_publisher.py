"""A publisher process that dies between publish confirms and the outbox delete.

``python -m tests.faults.crashing_publisher`` (from the repository root, settings from the
``CONVEYOR_*`` environment) runs the real relay, its publisher wrapped from outside so that it
calls ``os._exit(3)`` after a batch's confirms with probability ``FAULTS_CRASH_P``: the messages
are in RabbitMQ, the outbox rows are not deleted (the transaction dies with the connection), so
the next publisher sends them again.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

from conveyor.broker import LIBRARY_LOGGERS
from conveyor.core.config import Settings
from conveyor.core.logging import configure
from conveyor.publisher.relay import Relay

from .relay_faults import after_confirm


async def main() -> None:
    settings = Settings()
    p = float(os.environ.get("FAULTS_CRASH_P", "0.5"))

    async def crash(results: object) -> None:
        if random.random() < p:
            sys.stderr.write("crashing_publisher: os._exit(3) after confirm, before delete\n")
            sys.stderr.flush()
            os._exit(3)

    relay = after_confirm(Relay(settings), crash)
    await relay.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stderr.write("crashing_publisher: started\n")
    sys.stderr.flush()
    try:
        await relay.run(stop)
    finally:
        await relay.close()


if __name__ == "__main__":
    configure(quiet=(*LIBRARY_LOGGERS, "alembic"))
    asyncio.run(main())
