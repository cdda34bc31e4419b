"""Conveyor's pools run with JIT off (else the PgBouncer test times out): asyncpg reads the
definition of each non-builtin type (``job_status``, arrays) once per connection with a
catalog query whose estimated cost (~12 million) passes ``jit_above_cost``, so with the default
``jit = on`` every new connection's first statement JIT-compiled for 0.7-1 s (EXPLAIN ANALYZE on
this 2-core machine: generation + inlining + optimization + emission ~660-900 ms, the query
itself 2-8 ms). Twelve concurrent submits on fresh connections then queued ~10 s of compiling
on two cores, past a 5 s statement timeout. Conveyor's statements are index lookups that JIT
never speeds up."""

from __future__ import annotations

import time

from conveyor.store.connect import create_pool


async def test_a_pooled_connection_runs_without_jit(db_url: str) -> None:
    pool = await create_pool(db_url, application_name="test-jit", max_size=1)
    try:
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW jit") == "off"
            t = time.perf_counter()
            await conn.fetchval("SELECT $1::conveyor.job_status[]", ["PENDING"])  # introspects
            print(f"first custom-typed statement: {(time.perf_counter() - t) * 1000:.1f} ms")
    finally:
        await pool.close()
