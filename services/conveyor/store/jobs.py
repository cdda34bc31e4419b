"""Jobs as submitters and operators see them: insert, read, cancel, redrive.

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
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from ..core.errors import DebounceBusy
from ..core.jobs import Status
from .base import Connection, Statements, affected
from .connect import partition_key_checked
from .registry import bind, named
from .rows import Attempt, JobRow, NewJob

JOB_INSERT = named("job_insert")
JOB_GET = named("job_get")
JOB_GET_BY_IDEMPOTENCY_KEY = named("job_get_by_idempotency_key")
JOB_CANCEL = named("job_cancel")
STATEMENT_BOUND = named("statement_bound")
JOB_REDRIVE = named("job_redrive")
JOB_REDRIVE_FAILED = named("job_redrive_failed")
JOB_FENCE_MANY = named("job_fence_many")
JOB_UNIQUE_HOLDERS = named("job_unique_holders")
JOB_UNIQUE_DELETE_EXPIRED = named("job_unique_delete_expired")
JOB_UNIQUE_WAIT_BOUND = named("job_unique_wait_bound")
JOB_DEBOUNCE = named("job_debounce")
# how long a debounced submit waits for another transaction submitting with its key
DEBOUNCE_WAIT = 2.0

# Takeovers of keys whose job vanished, in one call: more would mean keys keep vanishing.
_TAKEOVER_ROUNDS = 3


def insert_arrays(jobs: Sequence[NewJob]) -> dict[str, Any]:
    """The column arrays of a job insert (``job_insert``, and a workflow's), by parameter
    name."""
    return {
        "id": [j.id for j in jobs],
        "job_type": [j.job_type for j in jobs],
        "payload": [j.payload_json for j in jobs],
        "priority": [j.priority for j in jobs],
        "max_retries": [j.max_retries for j in jobs],
        "timeout_seconds": [j.timeout_seconds for j in jobs],
        "run_at": [j.run_at for j in jobs],
        "delay": [j.delay_seconds for j in jobs],
        "idempotency_key": [j.idempotency_key for j in jobs],
        "request_hash": [j.request_hash for j in jobs],
        "partition_key": [j.partition_key for j in jobs],
    }


@dataclass(frozen=True, slots=True)
class Inserted:
    """What a submit wrote: the new rows by id, and for each row whose unique key another job
    holds, that job (``duplicates``, by the submitted row's id)."""

    inserted: dict[uuid.UUID, JobRow]
    duplicates: dict[uuid.UUID, JobRow]
    debounced: dict[uuid.UUID, JobRow] = field(default_factory=dict)  # folded into that job


def has_unique_keys(rows: Sequence[NewJob]) -> bool:
    """Whether a submit of ``rows`` may take a second statement (a key whose job vanished)."""
    return any(r.unique_key is not None for r in rows)


class JobStatements(Statements):
    async def job_get(self, conn: Connection, job_id: uuid.UUID) -> JobRow | None:
        row = await conn.fetchrow(self.sql[JOB_GET], job_id)
        return JobRow.from_record(row) if row is not None else None

    async def job_get_by_idempotency_key(self, conn: Connection, key: str) -> JobRow | None:
        row = await conn.fetchrow(self.sql[JOB_GET_BY_IDEMPOTENCY_KEY], key)
        return JobRow.from_record(row) if row is not None else None

    async def job_cancel(self, conn: Connection, job_id: uuid.UUID) -> bool:
        """Cancel a waiting job, or ask a running one to stop. False when not cancellable."""
        return await conn.fetchval(self.sql[JOB_CANCEL], job_id) is not None

    async def statement_bound(
        self, conn: Connection, *, statement: float, lock: float, idle: float
    ) -> None:
        """First in a transaction: its statements end after ``statement`` seconds, its lock
        waits after ``lock`` seconds, its session after ``idle`` seconds idle inside it (see
        ``STATEMENT_BOUND``)."""
        await conn.fetchval(
            self.sql[STATEMENT_BOUND],
            f"{round(statement * 1000)}ms",
            f"{round(lock * 1000)}ms",
            f"{round(idle * 1000)}ms",
        )

    async def job_redrive(self, conn: Connection, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """FAILED or CANCELLED jobs back to PENDING; a cancelled job that never ran and whose
        ``run_at`` is still ahead keeps its schedule (SCHEDULED). A cancelled retry's ``run_at``
        is a backoff, not a schedule: it runs now. Returns the ids redriven."""
        return [r["id"] for r in await conn.fetch(self.sql[JOB_REDRIVE], list(ids))]

    async def job_redrive_failed(
        self, conn: Connection, letters: Sequence[Attempt]
    ) -> list[uuid.UUID]:
        """Redrive each job only while it is still FAILED at the attempt its dead letter
        recorded. Returns the ids redriven; the other letters are stale."""
        rows = await conn.fetch(
            self.sql[JOB_REDRIVE_FAILED],
            [a.job_id for a in letters],
            [a.attempt for a in letters],
        )
        return [r["id"] for r in rows]

    async def job_fence_many(
        self, conn: Connection, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[Status, int]]:
        """id → (status, attempts); a missing id: no such job."""
        rows = await conn.fetch(self.sql[JOB_FENCE_MANY], list(ids))
        return {r["id"]: (Status(r["status"]), r["attempts"]) for r in rows}

    async def job_insert(
        self,
        conn: Connection,
        jobs: Sequence[NewJob],
        *,
        among: Sequence[uuid.UUID] = (),
        trace_context: str | None = None,
    ) -> dict[uuid.UUID, JobRow]:
        """Insert jobs and their outbox rows in one statement (atomic without an explicit
        transaction). Returns the inserted rows by id; a job whose idempotency key exists, or
        whose unique key is held (and not expired, nor held by one of ``among``), is missing
        from it. ``trace_context``: the submit's ``traceparent`` (``core/tracing.py``), stored
        with every job."""
        values = insert_arrays(jobs) | {
            "meta": [j.meta_json for j in jobs],
            "unique_key": [j.unique_key for j in jobs],
            "unique_for": [j.unique_for for j in jobs],
            "among": list(among),
            "trace_context": trace_context,
        }
        with partition_key_checked():
            rows = await conn.fetch(self.sql[JOB_INSERT], *bind(JOB_INSERT, values))
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

    async def job_unique_wait_bound(self, conn: Connection, seconds: float) -> str:
        """``SET LOCAL lock_timeout``: the rest of this transaction waits at most ``seconds`` for
        a key (or any lock) another transaction holds, then fails (``LockNotAvailableError``).
        Returns the bound it replaced."""
        row = await conn.fetchrow(self.sql[JOB_UNIQUE_WAIT_BOUND], f"{round(seconds * 1000)}ms")
        return str(row["before"])

    async def job_debounce(
        self, conn: Connection, job: NewJob, trace_context: str | None = None
    ) -> tuple[JobRow | None, bool]:
        """A debounced submit (``job.debounce``): the new job, or the waiting one it folded into
        (then True); None when its idempotency key is an earlier submit's (the caller replays
        that one; a key is kept by the job a submit created, never by one it folded into).
        Waits at most ``DEBOUNCE_WAIT`` for another transaction submitting with its key (an
        application's open transaction), then raises ``DebounceBusy``."""
        if job.idempotency_key is not None and await self.job_get_by_idempotency_key(
            conn, job.idempotency_key
        ):
            return None, False
        assert job.debounce is not None
        values = insert_arrays([job]) | {
            "meta": job.meta_json,
            "trace_context": trace_context,
            "debounce_seconds": job.debounce.seconds,
            "debounce_max": job.debounce.max_seconds,
            "debounce_key": job.debounce.key,
        }
        values = {k: v[0] if isinstance(v, list) else v for k, v in values.items()}
        for name in ("run_at", "delay"):  # the debounce's own
            del values[name]
        values["wait_bound"] = f"{round(DEBOUNCE_WAIT * 1000)}ms"
        try:
            with partition_key_checked():
                row = await conn.fetchrow(self.sql[JOB_DEBOUNCE], *bind(JOB_DEBOUNCE, values))
        except asyncpg.UniqueViolationError as exc:
            if getattr(exc, "constraint_name", None) != "jobs_idempotency_key_idx":
                raise
            return None, False  # a concurrent submit with its idempotency key won
        except asyncpg.LockNotAvailableError:
            raise DebounceBusy(
                f"another transaction is submitting a {job.job_type} job with this debounce key "
                "and has not committed: try again"
            ) from None
        # the caller's transaction, if any, keeps its own bound
        await conn.fetchrow(self.sql[JOB_UNIQUE_WAIT_BOUND], row["bound_before"])
        return JobRow.from_record(row), bool(row["debounced"])

    async def job_unique_delete_expired(self, conn: Connection, *, limit: int) -> int:
        return affected(await conn.execute(self.sql[JOB_UNIQUE_DELETE_EXPIRED], limit))

    async def job_insert_checked(
        self, conn: Connection, jobs: Sequence[NewJob], trace_context: str | None = None
    ) -> Inserted:
        """Insert ``jobs`` (``job_insert``), and find the holders of unique keys another job
        holds. A row missing from both results was refused by its idempotency key. Run it in a
        transaction when ``jobs`` has unique keys and must be all or none: a key whose job
        vanished is taken over by a second statement."""
        plain = [j for j in jobs if j.debounce is None]
        inserted = await self.job_insert(conn, plain, trace_context=trace_context) if plain else {}
        duplicates: dict[uuid.UUID, JobRow] = {}
        debounced: dict[uuid.UUID, JobRow] = {}
        for j in jobs:
            if j.debounce is not None:
                row, folded = await self.job_debounce(conn, j, trace_context)
                if row is not None:
                    (debounced if folded else inserted)[j.id] = row
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
            more = await self.job_insert(conn, firsts, among=vanished, trace_context=trace_context)
            inserted.update(more)
            pending = [j for j in retry if j.id not in more]
        return Inserted(inserted, duplicates, debounced)
