"""``CONVEYOR_DATABASE_URL``: the forms accepted, and the one-line refusal of a malformed URL.

An application's SQLAlchemy configuration names the driver in the scheme
(``postgresql+asyncpg://``, ``postgresql+psycopg://``, ``postgresql+psycopg2://``); Conveyor
connects with asyncpg (and Alembic through SQLAlchemy with its own driver choice), so any
``postgresql+<driver>`` form is read as the plain ``postgresql://`` URL. What cannot work whatever
the server does (another database's scheme, a port that is not a number, an unknown ``sslmode``)
is refused before anything connects: a process never retries a mistake as if it were an outage.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

SCHEMES = ("postgresql", "postgres")
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")
EXAMPLE = "postgresql://user@host:5432/dbname"


class DatabaseUrlError(ValueError):
    """A database URL that cannot be used (the message says why, in one line)."""


def normalize_database_url(url: str) -> str:
    """``url`` in the form asyncpg reads (``postgresql://…``), or ``DatabaseUrlError``.

    Accepted: ``postgresql://``, ``postgres://`` and SQLAlchemy's ``postgresql+<driver>://``.
    Checked: the port is a number, ``sslmode`` and ``target_session_attrs`` are values libpq
    knows. Everything else (hosts, credentials, other query parameters) is passed on as given."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise DatabaseUrlError(f"not a URL (expected {EXAMPLE})")
    base, plus, driver = scheme.lower().partition("+")
    if base not in SCHEMES or (plus and not driver):
        raise DatabaseUrlError(
            f"scheme {scheme!r} is not PostgreSQL's (postgresql://, postgres:// or "
            f"postgresql+<driver>://, e.g. {EXAMPLE})"
        )
    parts = urlsplit("postgresql://" + rest)
    for host in parts.netloc.rpartition("@")[2].split(","):  # asyncpg: host1:5432,host2:5433
        port = host.rpartition("]")[2].rpartition(":")[2] if ":" in host else ""
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise DatabaseUrlError(f"port {port!r} is not a number from 1 to 65535")
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "sslmode" and value not in SSLMODES:
            raise DatabaseUrlError(f"sslmode={value!r} is not one of {', '.join(SSLMODES)}")
        if key == "target_session_attrs" and value not in SESSION_ATTRS:
            raise DatabaseUrlError(
                f"target_session_attrs={value!r} is not one of {', '.join(SESSION_ATTRS)}"
            )
    return "postgresql://" + rest
