"""API keys (docs/security.md): only a SHA-256 of each key is stored, found by the key's
short public id. Created, listed and revoked by ``conveyor keys``; read by the API's
``api.auth.KeyCache``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .base import Connection, Statements, affected
from .registry import named

API_KEY_INSERT = named("api_key_insert")
API_KEY_GET = named("api_key_get")
API_KEY_LIST = named("api_key_list")
API_KEY_REVOKE = named("api_key_revoke")
API_RATE_TAKE = named("api_rate_take")


@dataclass(frozen=True, slots=True)
class ApiKeyRow:
    key_id: str
    name: str
    key_hash: bytes
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


def _row(r: Any) -> ApiKeyRow:
    return ApiKeyRow(
        r["key_id"],
        r["name"],
        bytes(r["key_hash"]),
        tuple(r["scopes"]),
        r["created_at"],
        r["revoked_at"],
    )


class KeyStatements(Statements):
    async def api_key_insert(
        self, conn: Connection, key_id: str, name: str, key_hash: bytes, scopes: Sequence[str]
    ) -> bool:
        """False when an active key already has this name (or, never in practice, this id)."""
        return (
            await conn.fetchval(self.sql[API_KEY_INSERT], key_id, name, key_hash, list(scopes))
            is not None
        )

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
