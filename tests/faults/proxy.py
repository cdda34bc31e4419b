"""A small asyncio TCP proxy for partition tests, without root: forwards everything until told
to ``blackhole`` — then bytes are held in both directions and new connections hang before they
reach the server, as in a silent network partition (each side's connection stays open: half
open) — and ``heal`` delivers what was held, as TCP would once the network is back.
``upstream_ports`` holds the local port of each open connection to the target (the
``client_port`` a PostgreSQL server shows in ``pg_stat_activity``), so a test can tell which
proxied client a server-side session belongs to."""

from __future__ import annotations

import asyncio
import contextlib


class Proxy:
    def __init__(self, target_host: str, target_port: int, listen: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen = listen
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.upstream_ports: set[int] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.listen, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def blackhole(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._open.wait()  # a partition: the connection never reaches the server
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError):
            writer.close()
            return
        self._writers.add(up_writer)
        port = int(up_writer.get_extra_info("sockname")[1])
        self.upstream_ports.add(port)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(lambda _t: self.upstream_ports.discard(port))

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self._open.wait()
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()
