"""Unique jobs and job metadata: the submit statement for rows that carry a ``unique_key`` or
``meta`` (rows with neither keep ``job_insert_many``, the hot path, unchanged).

A unique key is claimed in ``job_uniques`` by the same statement that inserts the job:
``INSERT … ON CONFLICT (key) DO UPDATE … WHERE expires_at <= now()``. PostgreSQL serialises
concurrent claims of one key on its row (a second claimer waits for the first to commit, then
re-checks the condition on the committed row), so exactly one of many concurrent submits inserts
the job; the others insert nothing and read the holder's job afterwards. A key is held for its
whole window whatever happens to the job (Oban's "unique for a period": a finished job still
answers duplicates until ``expires_at``). A key whose job no longer exists (deleted by retention,
or a claim whose job insert lost to an idempotency key) is taken over by a second statement
that names the missing job (``among``): a compare-and-set on the locked row, never a read of
another transaction's snapshot."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from .base import Connection, Statements, affected
from .jobs import JOB_COLUMNS, JobStatements, insert_arrays
from .registry import statement
from .rows import JobRow, NewJob

JOB_INSERT_FULL = statement(
    "job_insert_full",
    f"""
WITH u AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int2[], $5::int4[],
                         $6::float8[], $7::timestamptz[], $8::float8[], $9::text[], $10::text[],
                         $11::text[], $12::text[], $13::float8[]) WITH ORDINALITY
        AS u(id, job_type, payload, priority, max_retries, timeout_seconds, run_at, delay,
             ikey, rhash, meta, ukey, ufor, ord)
), firsts AS (  -- two rows of one statement with the same key: the first one claims it
    SELECT DISTINCT ON (ukey) id, ukey, ufor FROM u WHERE ukey IS NOT NULL ORDER BY ukey, ord
), won AS (
    INSERT INTO __schema__.job_uniques AS k (key, job_id, expires_at)
    SELECT ukey, id, now() + make_interval(secs => ufor) FROM firsts
    ON CONFLICT (key) DO UPDATE SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at
    WHERE k.expires_at <= now() OR k.job_id = ANY($14::uuid[])
    RETURNING job_id
), v AS (
    SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay)) AS due FROM u
    WHERE u.ukey IS NULL OR u.id IN (SELECT job_id FROM won)
), ins AS (
    INSERT INTO __schema__.jobs (id, job_type, status, priority, payload, max_retries,
                                 timeout_seconds, run_at, idempotency_key, request_hash, meta,
                                 trace_context)
    SELECT id, job_type,
           (CASE WHEN due > now() THEN 'SCHEDULED' ELSE 'PENDING' END)::__schema__.job_status,
           priority, payload::jsonb, max_retries, timeout_seconds, due, ikey, rhash, meta::jsonb,
           $15::text
    FROM v
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority)
    SELECT id, job_type, priority FROM ins WHERE status = 'PENDING'
)
SELECT {JOB_COLUMNS} FROM ins
""",
)

# The holders of keys: the job (NULL columns when it no longer exists) by key.
JOB_UNIQUE_HOLDERS = statement(
    "job_unique_holders",
    f"""
SELECT k.key AS unique_key, k.job_id AS holder, j.*
FROM __schema__.job_uniques k
LEFT JOIN LATERAL (SELECT {JOB_COLUMNS} FROM __schema__.jobs WHERE id = k.job_id) j ON true
WHERE k.key = ANY($1::text[])
""",
)

JOB_UNIQUE_DELETE_EXPIRED = statement(
    "job_unique_delete_expired",
    """
DELETE FROM __schema__.job_uniques WHERE key IN (
    SELECT key FROM __schema__.job_uniques WHERE expires_at < now() ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED
)
""",
)

# Inside a transaction: how long a statement may wait for a lock (a key another open
# transaction is claiming) before it fails with SQLSTATE 55P03; ends with the transaction.
JOB_UNIQUE_WAIT_BOUND = statement(
    "job_unique_wait_bound", "SELECT set_config('lock_timeout', $1, true)"
)

# Takeovers of keys whose job vanished, in one call: more would mean keys keep vanishing.
_TAKEOVER_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class Inserted:
    """What a submit wrote: the new rows by id, and for each row whose unique key another job
    holds, that job (``duplicates``, by the submitted row's id)."""

    inserted: dict[uuid.UUID, JobRow]
    duplicates: dict[uuid.UUID, JobRow]


def needs_full_insert(rows: Sequence[NewJob]) -> bool:
    return any(r.unique_key is not None or r.meta_json is not None for r in rows)


class UniqueStatements(Statements):
    async def job_insert_full(
        self,
        conn: Connection,
        jobs: Sequence[NewJob],
        *,
        among: Sequence[uuid.UUID] = (),
        trace_context: str | None = None,
    ) -> dict[uuid.UUID, JobRow]:
        """``job_insert_many`` with ``meta`` and unique keys: a row whose key is held (and not
        expired, nor held by one of ``among``) is not inserted. ``trace_context`` as there."""
        rows = await conn.fetch(
            self.sql[JOB_INSERT_FULL],
            *insert_arrays(jobs),
            [j.meta_json for j in jobs],
            [j.unique_key for j in jobs],
            [j.unique_for for j in jobs],
            list(among),
            trace_context,
        )
        return {r["id"]: JobRow.from_record(r) for r in rows}

    async def job_unique_holders(
        self, conn: Connection, keys: Sequence[str]
    ) -> dict[str, tuple[uuid.UUID, JobRow | None]]:
        """key → (the job id holding it, that job or None when it no longer exists)."""
        rows = await conn.fetch(self.sql[JOB_UNIQUE_HOLDERS], list(keys))
        return {
            r["unique_key"]: (r["holder"], JobRow.from_record(r) if r["id"] is not None else None)
            for r in rows
        }

    async def job_unique_wait_bound(self, conn: Connection, seconds: float) -> None:
        """``SET LOCAL lock_timeout``: the rest of this transaction waits at most ``seconds`` for
        a key (or any lock) another transaction holds, then fails (``LockNotAvailableError``)."""
        await conn.fetchval(self.sql[JOB_UNIQUE_WAIT_BOUND], f"{round(seconds * 1000)}ms")

    async def job_unique_delete_expired(self, conn: Connection, *, limit: int) -> int:
        return affected(await conn.execute(self.sql[JOB_UNIQUE_DELETE_EXPIRED], limit))

    async def job_insert_checked(
        self, conn: Connection, jobs: Sequence[NewJob], trace_context: str | None = None
    ) -> Inserted:
        """Insert ``jobs``: plain rows through ``job_insert_many`` (the hot path), rows with a
        unique key or ``meta`` through ``job_insert_full``. A row missing from both results was
        refused by its idempotency key. Run it in a transaction when ``jobs`` has unique keys
        and must be all or none: a key whose job vanished is taken over by a second statement.
        ``trace_context`` (tracing) is stored by either insert."""
        if not needs_full_insert(jobs):
            plain = cast(JobStatements, self)
            return Inserted(await plain.job_insert_many(conn, jobs, trace_context), {})
        inserted = await self.job_insert_full(conn, jobs, trace_context=trace_context)
        duplicates: dict[uuid.UUID, JobRow] = {}
        pending = [j for j in jobs if j.unique_key is not None and j.id not in inserted]
        for _ in range(_TAKEOVER_ROUNDS):
            if not pending:
                break
            keys = [j.unique_key for j in pending if j.unique_key is not None]
            holders = await self.job_unique_holders(conn, keys)
            vanished: list[uuid.UUID] = []
            retry: list[NewJob] = []
            for j in pending:
                assert j.unique_key is not None
                holder = holders.get(j.unique_key)
                if holder is None:  # the key expired and was deleted in between: claim again
                    retry.append(j)
                elif holder[1] is not None:
                    duplicates[j.id] = holder[1]
                elif holder[0] != j.id:
                    vanished.append(holder[0])
                    retry.append(j)
            if not retry:
                break
            # only the first of several rows with one key may claim it; the others are its
            # duplicates on the next round
            firsts = list({j.unique_key: j for j in reversed(retry)}.values())
            more = await self.job_insert_full(
                conn, firsts, among=vanished, trace_context=trace_context
            )
            inserted.update(more)
            pending = [j for j in retry if j.id not in more]
        return Inserted(inserted, duplicates)
