"""End to end: ``conveyor migrate --create-roles`` (what docker-compose.yml's and
k8s's migrate step runs) on a PostgreSQL cluster of the test's own, where role names are not
shared with anyone and TCP logins need a password (SCRAM). The real CLI creates the four login
roles with the passwords it is given (sent as SCRAM verifiers, never in clear), grants them,
and each role logs in with its password, does its work and is refused DDL. Run again with a new
password it rotates; a missing password is one line, no traceback, nothing created."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
from collections.abc import Iterator

import asyncpg
import pytest

from conveyor.store.roles import COMPONENTS, DEFAULT_ROLES

from ..e2e.test_processes import _run
from ..faults.infra import PG_BIN, PrivatePostgres

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres()
    pg.start()
    # the superuser keeps trust (the test's own door); every other TCP login needs its password
    (pg.data / "pg_hba.conf").write_text(
        "local all all trust\n"
        "host all postgres 127.0.0.1/32 trust\n"
        "host all all 127.0.0.1/32 scram-sha-256\n"
    )
    pg._pg(str(PG_BIN / "pg_ctl"), "-D", str(pg.data), "reload")
    try:
        yield pg
    finally:
        pg.stop()


def _login(pg: PrivatePostgres, role: str, password: str) -> str:
    return f"postgresql://{role}:{password}@127.0.0.1:{pg.port}/conveyor_roles"


def _env(pg: PrivatePostgres, passwords: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["CONVEYOR_DATABASE_URL"] = pg.url("conveyor_roles")
    env.update({f"CONVEYOR_{c.upper()}_DB_PASSWORD": p for c, p in passwords.items()})
    return env


async def test_migrate_creates_grants_and_rotates_the_component_roles(
    cluster: PrivatePostgres,
) -> None:
    passwords = {c: f"pw-{c}-{secrets.token_hex(4)}" for c in COMPONENTS}
    missing = dict(passwords)
    del missing["sweeper"]
    code, _, err = await _run(["migrate", "--create-roles"], _env(cluster, missing))
    assert code == 1, err
    assert "CONVEYOR_SWEEPER_DB_PASSWORD" in err and "Traceback" not in err, err
    assert all(p not in err for p in passwords.values()), err

    owner = await asyncpg.connect(cluster.url("postgres"))
    try:
        assert not await owner.fetchval(
            "SELECT count(*) FROM pg_roles WHERE rolname = ANY($1::text[])",
            list(DEFAULT_ROLES.values()),
        ), "a refused run must create no role"
    finally:
        await owner.close()

    code, out, err = await _run(["migrate", "--create-roles"], _env(cluster, passwords))
    assert code == 0, err
    assert "granted least privileges to conveyor_api, conveyor_publisher" in out, out

    owner = await asyncpg.connect(cluster.url("postgres"))
    try:
        stored = {r["rolname"]: r["rolpassword"] for r in await owner.fetch(
            "SELECT rolname, rolpassword FROM pg_authid WHERE rolname = ANY($1::text[])",
            list(DEFAULT_ROLES.values()))}  # fmt: skip
    finally:
        await owner.close()
    assert sorted(stored) == sorted(DEFAULT_ROLES.values())
    assert all(v.startswith("SCRAM-SHA-256$4096:") for v in stored.values()), stored

    for component, role in DEFAULT_ROLES.items():
        conn = await asyncpg.connect(_login(cluster, role, passwords[component]))
        try:
            # its grants work (every runtime role reads the schema version: readiness)
            assert await conn.fetchval("SELECT count(*) FROM conveyor.alembic_version") == 1
            # JIT off for the role, so also behind PgBouncer, which passes no session setting
            # (asyncpg's type introspection JIT-compiled for ~0.7-1 s a connection: docs/scaling.md)
            assert await conn.fetchval("SHOW jit") == "off"
            # the session bounds too (docs/configuration.md), for the same reason
            bounds = {n: await conn.fetchval(f"SHOW {n}") for n in (
                "idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout",
                "tcp_keepalives_idle", "tcp_user_timeout")}  # fmt: skip
            statement = "330s" if component == "api" else "1min"
            idle = "15s" if component == "publisher" else "5s"  # + its confirm wait
            assert bounds == {
                "idle_in_transaction_session_timeout": idle, "lock_timeout": "10s",
                "statement_timeout": statement, "tcp_keepalives_idle": "5",
                "tcp_user_timeout": "10000",
            }, component  # fmt: skip
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("CREATE TABLE conveyor.intruder (i int)")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("TRUNCATE conveyor.jobs")
        finally:
            await conn.close()
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(_login(cluster, role, "wrong-" + passwords[component]))

    # rotation: the same command with a new password; the old one stops working
    rotated = {**passwords, "worker": "pw-rotated-" + secrets.token_hex(4)}
    code, _, err = await _run(["migrate", "--create-roles"], _env(cluster, rotated))
    assert code == 0, err
    worker = DEFAULT_ROLES["worker"]
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(_login(cluster, worker, passwords["worker"]))
    conn = await asyncpg.connect(_login(cluster, worker, rotated["worker"]))
    await conn.close()
    await asyncio.sleep(0)


# Passwords an operator may well choose: quotes, backslashes, format() and SQL look-alikes, and
# Unicode that SASLprep (RFC 4013, which PostgreSQL, libpq and asyncpg apply to a SCRAM
# password) rewrites: a non-ASCII space, a ligature, a compatibility character, a combining
# accent, a character mapped to nothing. The verifier must be of the prepared password, or the
# role can never log in with the password the operator set.
AWKWARD = {
    "api": "it's \"quoted\" \\ back\\slash'; DROP ROLE x; -- %s %L $1",
    "publisher": "pa\u00a0ss-\ufb01sh-\u212b-e\u0301",
    "worker": "soft\u00adhyphen-\u2163-caf\u00e9",
    "sweeper": "\u043f\u0430\u0440\u043e\u043b\u044c-\u5bc6\u7801-\U0001f511",
}


async def test_awkward_passwords_log_in_with_asyncpg_and_libpq(cluster: PrivatePostgres) -> None:
    code, out, err = await _run(["migrate", "--create-roles"], _env(cluster, AWKWARD))
    assert code == 0, err
    assert all(p not in out + err for p in AWKWARD.values()), out + err
    refused = []
    for component, role in DEFAULT_ROLES.items():
        password = AWKWARD[component]
        try:
            conn = await asyncpg.connect(
                host="127.0.0.1", port=cluster.port, user=role, password=password,
                database="conveyor_roles",
            )  # fmt: skip
            await conn.close()
        except asyncpg.InvalidPasswordError:
            refused.append(("asyncpg", component))
        env = {**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"}
        psql = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", role, "-d",
             "conveyor_roles", "-Atc", "SELECT current_user"],
            env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if psql.returncode != 0 or psql.stdout.strip() != role:
            refused.append(("libpq", component))
    assert not refused, refused
