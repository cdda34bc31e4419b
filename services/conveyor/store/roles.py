"""Least privilege in PostgreSQL (README "Security"): what each component's role may do.

``conveyor migrate`` runs as the owner of the schema (the only role that runs DDL); each
runtime component connects as a role of its own that holds only these grants. None owns an
object or may CREATE in the schema, so none can run DDL, TRUNCATE or DROP. ``conveyor roles
sql`` prints the statements (``deploy/postgres-roles.sql`` is that output for the default
names); ``conveyor migrate --grant-roles`` applies them to roles that exist.

- api: submit (jobs, outbox), read, cancel, redrive, the dashboard (its purge DELETEs FAILED
  jobs and their attempts), the key table (read only), the type table (read only);
- worker: claim and finish jobs (jobs, attempts, outbox rows for retries and dead letters),
  register its types;
- sweeper: promotion, lease recovery, reconciler, retention (DELETE of old jobs and attempts);
- publisher: the relay (outbox read and DELETE) plus the sweeper's duties, which it runs by
  default."""

from __future__ import annotations

from .registry import check_schema

COMPONENTS = ("api", "publisher", "worker", "sweeper")
DEFAULT_ROLES = {c: f"conveyor_{c}" for c in COMPONENTS}

_VIEWS = "backlog, stuck_jobs, recent_failures, throughput"
_SWEEPER = [
    ("SELECT, UPDATE, DELETE", "jobs"),
    ("SELECT, INSERT, DELETE", "job_attempts"),
    ("SELECT, INSERT", "job_outbox"),
    ("SELECT", "job_types"),
    ("SELECT", _VIEWS),
]
GRANTS: dict[str, list[tuple[str, str]]] = {
    "api": [
        ("SELECT, INSERT, UPDATE, DELETE", "jobs"),
        ("SELECT, DELETE", "job_attempts"),
        ("INSERT", "job_outbox"),
        ("SELECT", "job_types"),
        ("SELECT", "api_keys"),
        ("SELECT", _VIEWS),
    ],
    "worker": [
        ("SELECT, UPDATE", "jobs"),
        ("SELECT, INSERT", "job_attempts"),
        ("INSERT", "job_outbox"),
        ("SELECT, INSERT, UPDATE", "job_types"),
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


def roles_sql(schema: str, roles: dict[str, str] | None = None) -> str:
    roles = roles or DEFAULT_ROLES
    head = [
        f"-- Conveyor least-privilege grants for schema {schema} (generated: conveyor roles sql).",
        "-- Create the login roles first (as a superuser or CREATEROLE), with your passwords:",
        *[f"--   CREATE ROLE {r} LOGIN PASSWORD '...';" for r in roles.values()],
        "-- then run this file as the role that ran `conveyor migrate` (the schema's owner).",
        "-- Optional, if no other application needs it: REVOKE TEMPORARY ON DATABASE <db> FROM",
        "-- PUBLIC (temporary tables are the one CREATE a runtime role could still run).",
    ]
    return "\n".join([*head, *[s + ";" for s in grant_statements(schema, roles)]]) + "\n"
