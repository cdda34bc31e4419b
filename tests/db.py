"""Raw SQL in tests: connections whose ``search_path`` starts with Conveyor's schema, so a test
can write ``SELECT … FROM jobs``. Product code never relies on ``search_path`` (every store
statement names the schema); only tests take this shortcut."""

from __future__ import annotations

from typing import Any

import asyncpg

from conveyor.store.schema import DEFAULT_SCHEMA

SCHEMA = DEFAULT_SCHEMA


async def connect(url: str, *, schema: str = SCHEMA, **kwargs: Any) -> asyncpg.Connection:
    settings = {**kwargs.pop("server_settings", {}), "search_path": f"{schema}, public"}
    return await asyncpg.connect(url, server_settings=settings, **kwargs)
