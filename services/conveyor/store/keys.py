"""API keys (docs/security.md): only a SHA-256 of each key is stored, found by the key's
short public id. Created, listed and revoked by ``conveyor keys``; read by the API's
``api.auth.KeyCache``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .base import Connection, Statements, affected
from .registry import statement

API_KEY_INSERT = statement(
    "api_key_insert",
    """
INSERT INTO __schema__.api_keys (key_id, name, key_hash, scopes)
VALUES ($1, $2, $3, $4::text[])
ON CONFLICT DO NOTHING
RETURNING created_at
""",
)

API_KEY_GET = statement(
    "api_key_get",
    """
SELECT key_id, name, key_hash, scopes, created_at, revoked_at
FROM __schema__.api_keys WHERE key_id = $1
""",
)

API_KEY_LIST = statement(
    "api_key_list",
    """
SELECT key_id, name, key_hash, scopes, created_at, revoked_at
FROM __schema__.api_keys ORDER BY revoked_at IS NOT NULL, name, created_at
""",
)

API_KEY_REVOKE = statement(
    "api_key_revoke",
    "UPDATE __schema__.api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL",
)

# The fleet-wide submit quota (``api/ratelimit.py``): refill the key's bucket for the time since
# its last take ($2 tokens a second, at most $3), hand out up to $4 whole tokens, and return
# what was handed out and what is left. ON CONFLICT ... DO UPDATE reads the row's old values in
# every SET expression, so ``refill`` is spelt out in each; one statement, one row lock.
_REFILL = "least($3::float8, b.tokens + greatest(0, extract(epoch FROM now() - b.at)) * $2::float8)"
API_RATE_TAKE = statement(
    "api_rate_take",
    f"""
INSERT INTO __schema__.api_rate AS b (key_id, tokens, granted, at)
VALUES ($1, $3::float8 - least(floor($3::float8), $4::float8),
        least(floor($3::float8), $4::float8), now())
ON CONFLICT (key_id) DO UPDATE SET
    granted = least(floor({_REFILL}), $4::float8),
    tokens = {_REFILL} - least(floor({_REFILL}), $4::float8),
    at = now()
RETURNING granted, tokens
""",
)


@dataclass(frozen=True, slots=True)
class ApiKeyRow:
    key_id: str
    name: str
    key_hash: bytes
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


def _row(r: Any) -> ApiKeyRow:
    return ApiKeyRow(r["key_id"], r["name"], bytes(r["key_hash"]), tuple(r["scopes"]),
                     r["created_at"], r["revoked_at"])  # fmt: skip


class KeyStatements(Statements):
    async def api_key_insert(
        self, conn: Connection, key_id: str, name: str, key_hash: bytes, scopes: Sequence[str]
    ) -> bool:
        """False when an active key already has this name (or, never in practice, this id)."""
        return await conn.fetchval(self.sql[API_KEY_INSERT], key_id, name, key_hash,
                                   list(scopes)) is not None  # fmt: skip

    async def api_key_get(self, conn: Connection, key_id: str) -> ApiKeyRow | None:
        r = await conn.fetchrow(self.sql[API_KEY_GET], key_id)
        return None if r is None else _row(r)

    async def api_key_list(self, conn: Connection) -> list[ApiKeyRow]:
        return [_row(r) for r in await conn.fetch(self.sql[API_KEY_LIST])]

    async def api_key_revoke(self, conn: Connection, name: str) -> int:
        return affected(await conn.execute(self.sql[API_KEY_REVOKE], name))

    async def api_rate_take(
        self, conn: Connection, who: str, per_second: float, size: float, want: int
    ) -> tuple[int, float]:
        """Take up to ``want`` tokens from ``who``'s fleet-wide bucket: (taken, tokens left)."""
        r = await conn.fetchrow(self.sql[API_RATE_TAKE], who, per_second, size, float(want))
        return int(r["granted"]), float(r["tokens"])
