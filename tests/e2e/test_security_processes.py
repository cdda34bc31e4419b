"""API keys with real processes: ``conveyor api`` requires keys by default, a key made by
``conveyor keys create`` runs a job end to end through the publisher and a worker, ``keys
revoke`` stops it, no process prints it; ``conveyor dev`` refuses a non-loopback host without
auth."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from conveyor.cli.dev import cmd_dev
from conveyor.cli.keys import cmd_keys
from conveyor.cli.main import build_parser
from conveyor.cli.processes import loopback
from conveyor.core.config import Settings

from ..stack import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CONVEYOR = [sys.executable, "-m", "conveyor.cli"]


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return env | {
        "CONVEYOR_DATABASE_URL": settings.database_url,
        "CONVEYOR_AMQP_URL": settings.amqp_url,
        "CONVEYOR_NAMESPACE": settings.namespace,
        "CONVEYOR_LOG_LEVEL": "debug",
        "CONVEYOR_SHUTDOWN_GRACE": "1",
    }


def test_dev_refuses_a_public_host_without_auth(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CONVEYOR_AUTH", raising=False)
    for host in ("0.0.0.0", "::", "192.0.2.1", "example.com"):
        args = build_parser().parse_args(["dev", "--app", "examples.app:router", "--host", host])
        assert cmd_dev(args) == 2
        err = capsys.readouterr().err
        assert "auth disabled" in err and "127.0.0.1" in err, (host, err)
    assert all(loopback(h) for h in ("127.0.0.1", "::1", "localhost", "127.9.9.9"))


async def _keys(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``conveyor keys ...`` in a thread of this process (a subprocess costs seconds)."""
    code = await asyncio.to_thread(cmd_keys, build_parser().parse_args(["keys", *argv]))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(120)
async def test_api_requires_keys_by_default_end_to_end(
    settings: Settings,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = _env(settings)
    for k, v in env.items():
        if k.startswith("CONVEYOR_"):
            monkeypatch.setenv(k, v)
    code, key, err = await _keys(capsys, "create", "--name", "ci", "--scopes", "jobs:write")
    key = key.strip()
    assert code == 0 and key.startswith("cvk_") and "only time" in err, err
    code, _, err = await _keys(capsys, "create", "--name", "ci", "--scopes", "jobs:read")
    assert code == 2 and "already named" in err
    code, _, err = await _keys(capsys, "create", "--name", "x", "--scopes", "root")
    assert code == 2 and "scopes must be" in err
    port = free_port()
    logs = {n: (tmp_path / f"{n}.log").open("wb") for n in ("api", "publisher", "worker")}
    procs = [
        await asyncio.create_subprocess_exec(
            *CONVEYOR, *args, env=env, cwd=ROOT, stdout=logs[n], stderr=logs[n]
        )
        for n, args in [
            ("api", ["api", "--port", str(port)]),
            ("publisher", ["publisher"]),
            ("worker", ["worker", "--app", "tests.apps:router", "--types", "echo"]),
        ]
    ]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            for _ in range(300):
                try:
                    if (await c.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            job = {"type": "echo", "payload": {"n": 1}}
            r = await c.post("/jobs", json=job)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            r = await c.post("/jobs", json=job, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 201, r.text
            await wait_for(db_url, [r.json()["id"]], statuses=["COMPLETED"], timeout=30)
            r = await c.get("/jobs", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200  # writing jobs includes reading them
            r = await c.put("/types/echo/limits", json={"concurrency": 1},
                            headers={"Authorization": f"Bearer {key}"})  # fmt: skip
            assert r.status_code == 403  # jobs:write only: no admin
            code, out, _ = await _keys(capsys, "list")
            assert code == 0 and "ci" in out and "jobs:write" in out and key not in out
            assert key.split("_", 2)[2] not in out
            code, _, err = await _keys(capsys, "revoke", "ci")
            assert code == 0, err
            t0 = time.monotonic()
            auth = {"Authorization": f"Bearer {key}"}
            while (await c.post("/jobs", json=job, headers=auth)).status_code != 401:
                assert time.monotonic() - t0 < 5
                await asyncio.sleep(0.1)
            code, _, err = await _keys(capsys, "revoke", "ci")
            assert code == 1 and "no active key" in err
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            await asyncio.wait_for(p.wait(), 30)
        for f in logs.values():
            f.close()
    api_log = (tmp_path / "api.log").read_text()
    assert "API keys required" in api_log and "http_request" in api_log
    for name in logs:
        assert key.split("_", 2)[2] not in (tmp_path / f"{name}.log").read_text(), name
