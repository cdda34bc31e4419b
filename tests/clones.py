"""Per-test databases without waiting: clones of the migrated template made ahead of time and
dropped behind the tests' backs.

A test would otherwise wait for ``CREATE DATABASE … TEMPLATE`` (0.3-2 s on a busy machine) and
for ``DROP DATABASE`` (which forces an immediate checkpoint of the whole server: 0.3-3 s) around a
call that often takes 0.1 s. ``Clones`` runs one thread that keeps ``spare`` clones ready and
one that drops the clones tests hand back. One ``Clones`` per process (per xdist worker), each
with its own names, so nothing is shared between workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg

_STOP = ""


class Clones:
    def __init__(self, admin_url: str, template: str, prefix: str, spare: int = 2) -> None:
        self.admin_url = admin_url
        self.template = template
        self.prefix = prefix  # names are f"{prefix}{n}"
        self.spare = spare
        self._names = itertools.count()
        self._ready: queue.Queue[str | BaseException] = queue.Queue()
        self._wanted = threading.Semaphore(spare)  # one release per clone to make
        self._drops: queue.Queue[str] = queue.Queue()
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(self._create_loop,), daemon=True),
            threading.Thread(target=self._run, args=(self._drop_loop,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ the tests' side

    def take(self, timeout: float = 120.0) -> str:
        """A fresh clone's name (blocks until one is ready)."""
        self._wanted.release()  # replace the one taken
        got = self._ready.get(timeout=timeout)
        if isinstance(got, BaseException):
            raise RuntimeError(f"could not clone {self.template}") from got
        return got

    def give_back(self, name: str) -> None:
        """Drop ``name`` (WITH FORCE) in the background."""
        self._drops.put(name)

    def close(self, timeout: float = 120.0) -> None:
        """Stop making clones and finish the pending drops (spare clones are left to the
        caller's clean-up by prefix)."""
        self._stopping.set()
        self._wanted.release()
        self._drops.put(_STOP)
        for t in self._threads:
            t.join(timeout)

    # ------------------------------------------------------------------ the threads

    def _run(self, loop_body: Callable[[asyncpg.Connection], Coroutine[Any, Any, None]]) -> None:
        async def main() -> None:
            conn = await asyncpg.connect(self.admin_url, timeout=10)
            try:
                await loop_body(conn)
            finally:
                with contextlib.suppress(Exception):
                    await conn.close()

        try:
            asyncio.run(main())
        except BaseException as exc:  # the tests see it on their next take()
            self._ready.put(exc)

    async def _create_loop(self, conn: asyncpg.Connection) -> None:
        while True:
            await asyncio.to_thread(self._wanted.acquire)
            if self._stopping.is_set():
                return
            name = f"{self.prefix}{next(self._names)}"
            try:
                await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
            except Exception as exc:
                self._ready.put(exc)
                continue
            self._ready.put(name)

    async def _drop_loop(self, conn: asyncpg.Connection) -> None:
        # DROP DATABASE waits for a checkpoint; drops running together share one, so whatever
        # has queued up is dropped at once, over a few connections
        async with asyncpg.create_pool(self.admin_url, min_size=0, max_size=4) as pool:
            while True:
                names = [await asyncio.to_thread(self._drops.get)]
                with contextlib.suppress(queue.Empty):
                    while True:
                        names.append(self._drops.get_nowait())
                await asyncio.gather(*(drop(pool, n) for n in names if n != _STOP))
                if _STOP in names:
                    return


async def drop(pool: asyncpg.Pool, name: str) -> None:
    with contextlib.suppress(Exception):  # the session's clean-up by prefix retries
        await pool.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
