"""A component's pool on a host that may vanish: ``python -m tests.faults.link_holder KEY``
(settings from the ``CONVEYOR_*`` environment, run inside a ``netns.Link``) opens two pooled
connections with the session bounds its settings ask for (``SessionBounds.of``, as every
component's pool), takes a transaction-level advisory lock ``KEY`` on the first and leaves it
idle inside that transaction (as a claim's row lock between two statements), keeps the second
idle outside any transaction, prints ``holding <pid of the first> <pid of the second>`` and
waits."""

from __future__ import annotations

import asyncio
import sys

from conveyor.core.config import Settings
from conveyor.store.bounds import SessionBounds
from conveyor.store.connect import create_pool


async def main(key: int) -> None:
    settings = Settings()
    pool = await create_pool(settings.database_url, application_name="link-holder", max_size=2,
                             bounds=SessionBounds.of(settings))  # fmt: skip
    locking = await pool.acquire()
    idle = await pool.acquire()
    txn = locking.transaction()
    await txn.start()
    await locking.fetchval("SELECT pg_advisory_xact_lock($1)", key)
    pids = [await c.fetchval("SELECT pg_backend_pid()") for c in (locking, idle)]
    print(f"holding {pids[0]} {pids[1]}", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
