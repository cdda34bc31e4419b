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
from .jobs import JobStatements, insert_arrays
from .registry import bind, named
from .rows import JobRow, NewJob

JOB_INSERT_FULL = named("job_insert_full")
JOB_UNIQUE_HOLDERS = named("job_unique_holders")
JOB_UNIQUE_DELETE_EXPIRED = named("job_unique_delete_expired")
JOB_UNIQUE_WAIT_BOUND = named("job_unique_wait_bound")

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
        values = insert_arrays(jobs) | {
            "meta": [j.meta_json for j in jobs],
            "unique_key": [j.unique_key for j in jobs],
            "unique_for": [j.unique_for for j in jobs],
            "among": list(among),
            "trace_context": trace_context,
        }
        rows = await conn.fetch(self.sql[JOB_INSERT_FULL], *bind(JOB_INSERT_FULL, values))
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
