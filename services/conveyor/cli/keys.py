"""``conveyor keys create|list|revoke``: API keys with scopes (docs/security.md).
``create`` prints the key once, on stdout, and stores only its SHA-256. ``conveyor roles sql``:
the least-privilege PostgreSQL grants (``store/roles.py``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from ..broker.permissions import rabbitmqctl_commands
from ..core.apikeys import new_key, parse_scopes
from ..core.config import Settings
from ..core.secrets import mask_url
from ..store import ApiKeyRow
from ..store.bounds import component_bounds
from ..store.connect import connect, connect_options
from ..store.roles import COMPONENTS, ensure_login_roles, grant_existing, roles_sql
from .support import database, guarded, list_by_default, listing, run, when


def add_parser(sub: Any) -> None:
    s = sub.add_parser("keys", help="create, list and revoke API keys")
    actions = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = actions.add_parser("create", help="create a key and print it once")
    c.add_argument("--name", required=True, help="a name for the key (unique among active keys)")
    c.add_argument("--scopes", required=True, help="comma-separated: jobs:read,jobs:write,admin")
    ls = actions.add_parser("list", help="every key: name, id, scopes, created, revoked")
    ls.add_argument("--json", action="store_true", help="one JSON object per key (JSON Lines)")
    cached = Settings.model_fields["auth_cache_seconds"].default
    revoke = (
        f"revoke the active key of this name (refused everywhere within {cached:g} s: "
        "CONVEYOR_AUTH_CACHE_SECONDS)"
    )
    r = actions.add_parser("revoke", help=revoke, description=revoke)
    r.add_argument("name", help="the key's name (as `conveyor keys list` prints it)")
    s.set_defaults(func=cmd_keys)
    list_by_default(s, actions, ls)

    s = sub.add_parser("roles", help="least-privilege PostgreSQL grants per component")
    actions = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser("sql", help="print the GRANT statements (deploy/postgres-roles.sql)")
    for component in COMPONENTS:
        q.add_argument(
            f"--{component}",
            default=f"conveyor_{component}",
            help=f"the {component}'s role (default conveyor_{component})",
        )
    q = actions.add_parser("amqp", help="print rabbitmqctl commands for the broker users")
    q.add_argument("--vhost", default="/", help="the RabbitMQ virtual host (default /)")
    q.add_argument("--types", help="comma-separated job types the worker may consume")
    s.set_defaults(func=cmd_roles)


def auth_banner(settings: Settings, *, dev: bool = False) -> str:
    """What a starting API says about auth (and, for dev, where its services are, masked)."""
    if settings.auth == "disabled":
        text = (
            "auth disabled (loopback only)" if dev else "auth DISABLED: whoever reaches it is admin"
        )
    else:
        text = "API keys required (conveyor keys create --name N --scopes jobs:read,jobs:write)"
    if dev:
        text += (
            f"\nDatabase {mask_url(settings.database_url)}, broker {mask_url(settings.amqp_url)}"
        )
    return text


def cmd_roles(args: argparse.Namespace) -> int:
    try:
        settings = Settings()
        if args.action == "amqp":
            types = [t.strip() for t in args.types.split(",")] if args.types else None
            sys.stdout.write(rabbitmqctl_commands(settings.namespace, args.vhost, types))
            return 0
        roles = {c: getattr(args, c) for c in COMPONENTS}
        sys.stdout.write(roles_sql(settings.db_schema, roles))
    except ValueError as exc:
        print(f"conveyor roles: {exc}", file=sys.stderr)
        return 2
    return 0


def role_passwords(environ: Mapping[str, str]) -> dict[str, str]:
    """``conveyor migrate --create-roles``: each component's password from
    ``CONVEYOR_<COMPONENT>_DB_PASSWORD``; raises ValueError naming the missing ones."""
    names = {c: f"CONVEYOR_{c.upper()}_DB_PASSWORD" for c in COMPONENTS}
    missing = [n for n in names.values() if not environ.get(n)]
    if missing:
        raise ValueError(f"--create-roles needs {', '.join(missing)}")
    return {c: environ[n] for c, n in names.items()}


async def grant_roles(settings: Settings, passwords: Mapping[str, str] | None = None) -> list[str]:
    """``conveyor migrate --grant-roles``: the grants to the default roles that exist; with
    ``passwords`` (``--create-roles``), first create those roles or set their passwords."""
    conn = await connect(settings.database_url, **connect_options(settings.db_pooler))
    try:
        if passwords:
            bounds = {c: b.server_settings() for c, b in component_bounds(settings).items()}
            await ensure_login_roles(conn, passwords, bounds)
        return await grant_existing(conn, settings.db_schema)
    finally:
        await conn.close()


async def create_key(settings: Settings, name: str, scopes: str) -> str:
    """The new key (raises ValueError for bad scopes or a name in use)."""
    wanted = parse_scopes(scopes)
    if not name.strip() or len(name) > 100:
        raise ValueError("a key name is 1 to 100 characters")
    key, key_id, key_hash = new_key()
    async with database(settings) as (store, conn):
        ok = await store.api_key_insert(conn, key_id, name, key_hash, wanted)
    if not ok:
        raise ValueError(f"an active key is already named {name!r}: revoke it or pick a name")
    return key


async def revoke_key(settings: Settings, name: str) -> int:
    async with database(settings) as (store, conn):
        return await store.api_key_revoke(conn, name)


async def _list(settings: Settings, as_json: bool = False) -> int:
    async with database(settings) as (store, conn):
        rows = await store.api_key_list(conn)
    listing(rows, as_json, _key_record, _key_line)
    if not rows and not as_json:
        print("no keys: conveyor keys create --name NAME --scopes jobs:read,jobs:write")
    return 0


def _key_record(k: ApiKeyRow) -> dict[str, Any]:
    """No REST route lists keys: the row's own names (never the key, never its hash)."""
    return {
        "name": k.name,
        "key_id": k.key_id,
        "scopes": list(k.scopes),
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
    }


def _key_line(k: ApiKeyRow) -> str:
    revoked = f"revoked {when(k.revoked_at)}" if k.revoked_at else "active"
    return (
        f"{k.name:<24} cvk_{k.key_id}_…  {','.join(k.scopes):<28} "
        f"created {when(k.created_at)}  {revoked}"
    )


def cmd_keys(args: argparse.Namespace) -> int:
    return guarded(lambda: _keys(args, Settings()), "keys")  # its own exit code when called alone


def _keys(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "create":
        print(run(create_key(settings, args.name, args.scopes), failed=True))
        print(
            f"key {args.name!r} created: this is the only time it is shown; send it as "
            "'Authorization: Bearer <key>'",
            file=sys.stderr,
        )
        return 0
    if args.action == "revoke":
        if run(revoke_key(settings, args.name), failed=True) == 0:
            print(f"conveyor keys: no active key named {args.name!r}", file=sys.stderr)
            return 1
        print(
            f"key {args.name!r} revoked (refused by every API within "
            f"{settings.auth_cache_seconds:g} s)",
            file=sys.stderr,
        )
        return 0
    return run(_list(settings, args.json), failed=True)
