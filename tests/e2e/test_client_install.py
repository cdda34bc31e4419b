"""``pip install conveyor`` (no extras) is enough for ``conveyor.client``: a fresh virtualenv
with the project installed the way a user does imports the client and submits and waits for a
job against the real stack. (httpx once came only with the ``test`` extra.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import asyncpg
import pytest

from conveyor import Job, JobRouter
from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types

from ..stack import running_stack

ROOT = Path(__file__).resolve().parents[2]

router = JobRouter()


@router.job("plain_double")
async def double(job: Job) -> dict[str, int]:
    return {"double": job.payload["n"] * 2}


USE = textwrap.dedent(
    """
    import json, sys
    from conveyor.client import Client

    with Client(sys.argv[1]) as c:
        job = c.submit("plain_double", {"n": 21})
        done = c.wait(job.id, timeout=30)
        print(json.dumps({"status": done.status, "result": done.result}))
    """
)


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding the project installed without extras (pip's cache makes it quick)."""
    venv = tmp_path_factory.mktemp("plainenv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return py


async def test_the_client_works_on_a_plain_install(plain_venv: Path, settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        await register_router_types(conn, router)
    finally:
        await conn.close()
    async with running_stack(settings, router) as stack:
        proc = await asyncio.create_subprocess_exec(
            str(plain_venv),
            "-c",
            USE,
            str(stack.client.base_url),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out) == {"status": "COMPLETED", "result": {"double": 42}}
