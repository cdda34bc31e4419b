"""``CONVEYOR_LOG_FORMAT=json``: every line a process writes to stderr is one JSON object, the
banner, uvicorn's own lines and the one-line errors included."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from conveyor.core.config import Settings

from ..stack import free_port

ROOT = Path(__file__).resolve().parents[2]
CONVEYOR = [sys.executable, "-m", "conveyor.cli"]

pytestmark = pytest.mark.timeout(90)


def _env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "CONVEYOR_DATABASE_URL": settings.database_url,
        "CONVEYOR_AMQP_URL": settings.amqp_url,
        "CONVEYOR_NAMESPACE": settings.namespace,
        "CONVEYOR_AUTH": "disabled",
        "CONVEYOR_LOG_FORMAT": "json",
    }


def _objects(stderr: bytes) -> list[dict[str, object]]:
    lines = stderr.decode().splitlines()
    text = [line for line in lines if not _is_object(line)]
    assert not text, f"{len(text)} of {len(lines)} lines are not JSON objects: {text}"
    return [orjson.loads(line) for line in lines]


def _is_object(line: str) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


@pytest.mark.parametrize("command", ["dev", "api"])
async def test_every_line_is_json(settings: Settings, command: str) -> None:
    port = free_port()
    args = ["dev", "--app", "examples.app:router"] if command == "dev" else ["api"]
    proc = await asyncio.create_subprocess_exec(
        *CONVEYOR, *args, "--port", str(port), env=_env(settings), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/healthz")).status_code == 200:
                        break
                assert proc.returncode is None and time.monotonic() < deadline
                await asyncio.sleep(0.1)
            job = await client.post("/jobs", json={"type": "hello", "payload": {"name": "x"}})
            assert job.status_code == 201
            assert (await client.post("/jobs", content=b"{not json")).status_code == 400
        # a request uvicorn itself rejects: it logs "Invalid HTTP request received."
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x00\x01 not http\r\n\r\n")
        await writer.drain()
        await reader.read()
        writer.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    objects = _objects(err)
    actions = {o.get("action") for o in objects}
    assert ("dev_running" if command == "dev" else "api_listening") in actions, objects
    assert any(o["logger"] == "uvicorn.error" for o in objects), objects
    assert all({"ts", "level", "logger"} <= o.keys() for o in objects), objects


async def test_a_one_line_error_is_json(settings: Settings) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            *CONVEYOR, "api", "--port", str(port), env=_env(settings), cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    (line,) = _objects(err)
    assert line["level"] == "error" and "in use" in str(line["message"]), line
