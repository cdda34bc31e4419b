"""``CONVEYOR_DATABASE_URL``: SQLAlchemy's driver forms work everywhere a URL is read; a URL no
server can accept is one line and exit 2 at once, from every command, never a traceback and
never a retry loop; an outage is still waited out."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from conveyor.core.config import Settings
from conveyor.core.dburl import DatabaseUrlError, normalize_database_url

ROOT = Path(__file__).resolve().parents[2]
CONVEYOR = [sys.executable, "-m", "conveyor.cli"]

pytestmark = pytest.mark.timeout(90)


def _env(settings: Settings, url: str) -> dict[str, str]:
    return {
        **os.environ,
        "CONVEYOR_DATABASE_URL": url,
        "CONVEYOR_AMQP_URL": settings.amqp_url,
        "CONVEYOR_NAMESPACE": settings.namespace,
    }


async def _run(args: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, float]:
    """Exit code, stderr and seconds taken (a process still running at ``timeout`` fails)."""
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *CONVEYOR, *args, env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        _, err = await proc.communicate()
        tail = err.decode()[-2000:]
        raise AssertionError(f"{args} still running after {timeout} s:\n{tail}") from None
    return proc.returncode or 0, err.decode(), time.monotonic() - t0


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg", "psycopg2"])
async def test_migrate_accepts_sqlalchemy_driver_urls(
    settings: Settings, db_url: str, driver: str
) -> None:
    url = db_url.replace("postgresql://", f"postgresql+{driver}://", 1)
    assert url != db_url
    code, err, _ = await _run(["migrate"], _env(settings, url), timeout=60)
    assert code == 0 and "Traceback" not in err, err


async def test_jobs_command_reads_a_sqlalchemy_url(settings: Settings, db_url: str) -> None:
    url = db_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    code, err, _ = await _run(["jobs", "list"], _env(settings, url), timeout=30)
    assert code == 0, err


BAD = {
    "sslmode": ("?sslmode=bogus", "sslmode='bogus'"),
    "scheme": ("mysql", "scheme 'mysql'"),
    "port": ("port", "port 'notaport'"),
}


def _bad(db_url: str, kind: str) -> str:
    if kind == "scheme":
        return db_url.replace("postgresql://", "mysql://", 1)
    if kind == "port":
        return db_url.replace("127.0.0.1:5432", "127.0.0.1:notaport", 1)
    return db_url + BAD[kind][0]


@pytest.mark.parametrize("kind", list(BAD))
@pytest.mark.parametrize(
    "args",
    [["migrate"], ["worker", "--app", "tests.apps:router"], ["publisher"], ["sweeper"],
     ["dev", "--app", "tests.apps:router"], ["api"]],
    ids=lambda a: a[0],
)  # fmt: skip
async def test_a_malformed_url_is_one_line_and_exit_2(
    settings: Settings, db_url: str, args: list[str], kind: str
) -> None:
    env = {**_env(settings, _bad(db_url, kind)), "CONVEYOR_AUTH": "disabled"}
    code, err, took = await _run(args, env, timeout=20)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "CONVEYOR_DATABASE_URL" in err and BAD[kind][1] in err, err
    assert took < 15


async def test_a_connection_option_no_server_accepts_is_not_retried(
    settings: Settings, db_url: str
) -> None:
    """asyncpg refuses ``ssl_min_protocol_version=bogus`` only when it connects: the first
    attempt says so in one line instead of retrying it as if PostgreSQL were down."""
    url = db_url + "?ssl_min_protocol_version=bogus"
    for args in (["worker", "--app", "tests.apps:router"], ["publisher"], ["sweeper"]):
        code, err, _ = await _run(args, _env(settings, url), timeout=20)
        assert code == 2, err
        lines = err.strip().splitlines()
        assert "cannot start: ClientConfigurationError" in lines[-1], err
        assert "start_failed" not in err and "Traceback" not in err, err


def test_url_forms() -> None:
    base = "postgres@127.0.0.1:5432/conveyor"
    for scheme in ("postgresql", "postgres", "postgresql+asyncpg", "POSTGRESQL+psycopg"):
        assert normalize_database_url(f"{scheme}://{base}") == f"postgresql://{base}"
    for kept in (
        "postgresql:///conveyor?host=/var/run/postgresql",  # a Unix socket
        "postgresql://u:p@db1:5432,db2:5433/conveyor?target_session_attrs=read-write",
        "postgresql://u@[::1]:5432/conveyor?sslmode=verify-full&application_name=x",
    ):
        assert normalize_database_url(kept) == kept
    for bad in (
        "127.0.0.1:5432/conveyor",
        "postgresql+://h/d",
        "sqlite:///x.db",
        "postgresql://h:70000/d",
        "postgresql://h/d?target_session_attrs=bogus",
    ):
        with pytest.raises(DatabaseUrlError):
            normalize_database_url(bad)
    assert Settings(database_url=f"postgresql+asyncpg://{base}").database_url.startswith(
        "postgresql://"
    )
