"""Least privilege in PostgreSQL (docs/security.md): what each component's role may do.

``conveyor migrate`` runs as the owner of the schema (the only role that runs DDL); each
runtime component connects as a role of its own that holds only these grants. None owns an
object or may CREATE in the schema, so none can run DDL, TRUNCATE or DROP. ``conveyor roles
sql`` prints the statements (``deploy/postgres-roles.sql`` is that output for the default
names); ``conveyor migrate --grant-roles`` applies them to roles that exist.

- api: submit (jobs, outbox, unique keys), read, cancel, redrive, the dashboard (its purge
  DELETEs FAILED jobs and their attempts), the key table (read only), job types (pause and
  limits), schedules;
- worker: claim and finish jobs (jobs, attempts, outbox rows for retries and dead letters),
  follow-up jobs, register its types and its handlers' schedules;
- sweeper: promotion, lease recovery, reconciler, retention (DELETE of old jobs, attempts and
  expired unique keys), schedule ticks (new jobs);
- publisher: the relay (outbox read and DELETE) plus the sweeper's duties, which it runs by
  default."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from collections.abc import Mapping
from typing import Any

from .registry import TEMPLATES, check_schema, named

# catalog statements (``sql/catalog.sql``): they name no schema, so they need no rendering
ROLE_FIND = named("role_find")
ROLE_LOGIN_SQL = named("role_login_sql")
ROLE_JIT_OFF_SQL = named("role_jit_off_sql")
ROLE_SET_SQL = named("role_set_sql")

COMPONENTS = ("api", "publisher", "worker", "sweeper")
DEFAULT_ROLES = {c: f"conveyor_{c}" for c in COMPONENTS}

_VIEWS = (
    "backlog, stuck_jobs, recent_failures, throughput, "
    "running_workflows, blocked_jobs, workflow_counts"
)
_SWEEPER = [
    # INSERT: a schedule's tick is a new job (with its unique key and outbox row)
    ("SELECT, INSERT, UPDATE, DELETE", "jobs"),
    ("SELECT, INSERT, DELETE", "job_attempts"),
    # UPDATE: the reconciler finds rows a stopped relay holds with FOR KEY SHARE SKIP LOCKED
    # (``outbox_held_ids``), which PostgreSQL allows only with UPDATE; no statement updates one
    ("SELECT, INSERT, UPDATE", "job_outbox"),
    # the admission duty: admit() moves the type's round-robin cursor
    ("SELECT, UPDATE (admit_cursor)", "job_types"),
    # admit() reads the keys' overrides; a schedule's tick of an ordered type takes its place
    ("SELECT, INSERT, UPDATE", "partitions"),
    ("SELECT, INSERT, UPDATE, DELETE", "job_uniques"),  # retention drops expired keys
    ("SELECT, UPDATE", "schedules"),  # the schedules duty advances next_run_at
    # the workflow triggers run as whoever changes a job's status (lease recovery, here); the
    # workflows duty finishes workflows, retention deletes finished ones whole
    ("SELECT, UPDATE, DELETE", "workflows"),
    ("SELECT, DELETE", "job_dependencies"),
    ("SELECT", _VIEWS),
]
GRANTS: dict[str, list[tuple[str, str]]] = {
    "api": [
        ("SELECT, INSERT, UPDATE, DELETE", "jobs"),
        ("SELECT, DELETE", "job_attempts"),
        # SELECT: the outbox watch reads the oldest row's age (``outbox_watch``)
        ("SELECT, INSERT", "job_outbox"),
        # pause/resume and limits (admin): only those columns, not the handlers' defaults
        (
            "SELECT, UPDATE (paused, concurrency, rate_limit, rate_period, limits_set_at)",
            "job_types",
        ),
        # the keys' overrides (admin); a submit of an ordered type takes its key's next place
        ("SELECT, INSERT, UPDATE, DELETE", "partitions"),
        ("SELECT", "api_keys"),
        ("SELECT, INSERT, UPDATE", "api_rate"),  # the fleet-wide submit quota's buckets
        ("SELECT, INSERT, UPDATE", "job_uniques"),  # unique jobs: the submit claims the key
        ("SELECT, INSERT, UPDATE, DELETE", "schedules"),  # /schedules (admin)
        ("SELECT, INSERT, UPDATE", "workflows"),  # /workflows; cancel, retry via the triggers
        ("SELECT, INSERT", "job_dependencies"),
        ("SELECT", _VIEWS),
    ],
    "worker": [
        # INSERT: follow-up jobs (job.enqueue) committed with the attempt's completion
        ("SELECT, INSERT, UPDATE", "jobs"),
        ("SELECT, INSERT", "job_attempts"),
        # SELECT, DELETE: a completion's worker takes the outbox rows of the released jobs it
        # runs itself (job_claim_released), in the transaction that wrote them
        ("SELECT, INSERT, DELETE", "job_outbox"),
        ("SELECT, INSERT, UPDATE", "job_types"),
        # an outcome runs the admission pass of its type; an ordered follow-up takes its place
        ("SELECT, INSERT, UPDATE", "partitions"),
        ("SELECT, INSERT, UPDATE", "job_uniques"),
        ("SELECT, INSERT, UPDATE", "schedules"),  # handler-declared schedules, at start
        # a completion releases dependents and finishes workflows (the triggers, as this role)
        ("SELECT, UPDATE", "workflows"),
        ("SELECT", "job_dependencies"),
    ],
    "sweeper": _SWEEPER,
    "publisher": [
        *[(p, o) for p, o in _SWEEPER if o != "job_outbox"],
        # UPDATE: outbox_take_batch locks its rows (FOR UPDATE SKIP LOCKED), which PostgreSQL
        # allows only with UPDATE; no statement of the relay updates a row
        ("SELECT, INSERT, UPDATE, DELETE", "job_outbox"),
    ],
}


def grant_statements(schema: str, roles: dict[str, str] | None = None) -> list[str]:
    """The GRANT statements for ``roles`` (component → role name; default ``conveyor_<c>``)."""
    check_schema(schema)
    roles = roles or DEFAULT_ROLES
    out = [f"REVOKE ALL ON SCHEMA {schema} FROM PUBLIC"]
    for component, role in roles.items():
        check_schema(role)  # the same plain-identifier rule as schema names
        out.append(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        out.append(f"GRANT SELECT ON {schema}.alembic_version TO {role}")  # readiness
        for privileges, objects in GRANTS[component]:
            names = ", ".join(f"{schema}.{o.strip()}" for o in objects.split(","))
            out.append(f"GRANT {privileges} ON {names} TO {role}")
        if any("INSERT" in p for p, o in GRANTS[component] if o == "job_outbox"):
            out.append(f"GRANT USAGE ON SEQUENCE {schema}.job_outbox_id_seq TO {role}")
    return out


async def grant_existing(conn: Any, schema: str) -> list[str]:
    """Apply the grants, in one transaction, to those of ``DEFAULT_ROLES`` that exist; returns
    their names."""
    found = {
        r["rolname"] for r in await conn.fetch(TEMPLATES[ROLE_FIND], list(DEFAULT_ROLES.values()))
    }
    roles = {c: r for c, r in DEFAULT_ROLES.items() if r in found}
    async with conn.transaction():
        for statement in grant_statements(schema, roles):
            await conn.execute(statement)
    return sorted(roles.values())


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = 4096) -> str:
    """PostgreSQL's SCRAM-SHA-256 verifier of ``password`` (RFC 5802/7677, the format of
    ``pg_authid.rolpassword``), so the plain password never reaches the server or its logs:
    ``CREATE ROLE … PASSWORD '<verifier>'`` stores it as given. Of the password as SASLprep
    prepares it, as PostgreSQL's own ``PASSWORD 'plain'`` and every client (libpq, asyncpg) do."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    prepared = saslprep(password).encode("utf-8", "surrogateescape")  # os.environ: bytes kept
    salted = hashlib.pbkdf2_hmac("sha256", prepared, salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


async def ensure_login_roles(
    conn: Any,
    passwords: Mapping[str, str],
    role_settings: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Create each component's login role (``DEFAULT_ROLES``) with its password, or set the
    password of one that exists (rotation), with ``jit = off`` (``connect.create_pool``) and
    ``role_settings[component]`` (the session bounds, ``bounds.component_bounds``: a pooler
    passes no startup parameter), in one transaction; returns the role names. Needs
    CREATEROLE (or a superuser): the role that runs ``conveyor migrate`` in a deployment."""
    names = []
    async with conn.transaction():
        for component, password in passwords.items():
            if not password:
                raise ValueError(f"an empty password for {component}")
            role = DEFAULT_ROLES[component]
            login = await conn.fetchval(TEMPLATES[ROLE_LOGIN_SQL], role, scram_verifier(password))
            await conn.execute(login)
            # for connections through a pooler, which cannot pass it (``connect.create_pool``)
            await conn.execute(await conn.fetchval(TEMPLATES[ROLE_JIT_OFF_SQL], role))
            for name, value in (role_settings or {}).get(component, {}).items():
                if not name.replace("_", "").isalpha():
                    raise ValueError(f"not a setting name: {name!r}")
                await conn.execute(await conn.fetchval(TEMPLATES[ROLE_SET_SQL], role, name, value))
            names.append(role)
    return names


def roles_sql(schema: str, roles: dict[str, str] | None = None) -> str:
    roles = roles or DEFAULT_ROLES
    head = [
        f"-- Conveyor least-privilege grants for schema {schema} (generated: conveyor roles sql).",
        "-- Create the login roles first (as a superuser or CREATEROLE), with your passwords:",
        *[f"--   CREATE ROLE {r} LOGIN PASSWORD '...';" for r in roles.values()],
        '-- and, behind PgBouncer, JIT off on them (docs/scaling.md, "PgBouncer"):',
        *[f"--   ALTER ROLE {r} SET jit = off;" for r in roles.values()],
        "-- and the session bounds (docs/configuration.md): ALTER ROLE <role> SET",
        "-- idle_in_transaction_session_timeout, lock_timeout, statement_timeout,",
        "-- tcp_keepalives_idle/_interval/_count, tcp_user_timeout (`conveyor migrate",
        "-- --create-roles` sets them and jit).",
        "-- then run this file as the role that ran `conveyor migrate` (the schema's owner).",
        "-- Optional, if no other application needs it: REVOKE TEMPORARY ON DATABASE <db> FROM",
        "-- PUBLIC (temporary tables are the one CREATE a runtime role could still run).",
    ]
    return "\n".join([*head, *[s + ";" for s in grant_statements(schema, roles)]]) + "\n"


# SASLprep (RFC 4013) as PostgreSQL applies it to a SCRAM password (src/common/saslprep.c):
# libpq and asyncpg prepare the password a client sends this way, so a verifier that
# ``conveyor migrate --create-roles`` computes must be of the prepared password too. An ASCII
# password is used as is; otherwise map (non-ASCII spaces to a space, "commonly mapped to
# nothing" characters removed), normalize to NFKC, and use the result unless it is empty, holds a
# prohibited or unassigned character, or breaks the bidirectional rules: then the original.
_PROHIBITED = (
    stringprep.in_table_a1,  # unassigned code points: PostgreSQL prohibits them (stored strings)
    stringprep.in_table_c12,
    stringprep.in_table_c21_c22,
    stringprep.in_table_c3,
    stringprep.in_table_c4,
    stringprep.in_table_c5,
    stringprep.in_table_c6,
    stringprep.in_table_c7,
    stringprep.in_table_c8,
    stringprep.in_table_c9,
)


def saslprep(password: str) -> str:
    """The password PostgreSQL's SCRAM hashes for ``password``."""
    if password.isascii():
        return password
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in password if not stringprep.in_table_b1(c)
    )
    prepared = unicodedata.normalize("NFKC", mapped)
    if not prepared:
        return password
    if any(test(c) for c in prepared for test in _PROHIBITED):
        return password
    if any(stringprep.in_table_d1(c) for c in prepared):
        ends = stringprep.in_table_d1(prepared[0]) and stringprep.in_table_d1(prepared[-1])
        if not ends or any(stringprep.in_table_d2(c) for c in prepared):
            return password
    return prepared
