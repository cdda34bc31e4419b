"""The dead-letter queue, for operators: list, redrive and purge copies of FAILED jobs (and
poison messages). PostgreSQL decides: a copy whose job is no longer FAILED (already redriven,
e.g. with ``POST /jobs/{id}/retry``) is stale and is removed by any redrive or purge, so a job is
never redriven twice. Dead letters never expire on their own."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from ..core.amqp.topology import Topology
from ..core.jobs import Status
from ..store import Store


@dataclass
class DeadLetter:
    job_id: uuid.UUID | None
    job_type: str | None
    error: str | None
    status: Status | None  # the job's status in PostgreSQL (None: unknown job or poison)
    raw: bytes

    @property
    def stale(self) -> bool:
        return self.job_id is not None and self.status not in (Status.FAILED, Status.CANCELLED)

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": str(self.job_id) if self.job_id else None,
            "type": self.job_type,
            "status": self.status.value if self.status else None,
            "stale": self.stale,
            "error": (self.error or "")[:500] or None,
            "raw": None if self.job_id else self.raw[:200].decode("utf-8", "replace"),
        }


Decision = Literal["keep", "drop", "redrive"]


def _parse(body: bytes) -> tuple[uuid.UUID | None, str | None, str | None]:
    try:
        data = orjson.loads(body)
        return uuid.UUID(data["id"]), str(data.get("type")), data.get("error")
    except Exception:
        return None, None, None


async def scan(
    connection: AbstractRobustConnection,
    pool: Any,
    store: Store,
    topology: Topology,
    decide: Callable[[DeadLetter], Decision],
    *,
    limit: int | None = None,
) -> list[tuple[DeadLetter, Decision]]:
    """Walk the dead-letter queue once (at most ``limit`` messages). ``decide`` picks per
    message: keep it, drop it, or redrive its job (then drop it). Kept messages go back."""
    channel = await connection.channel()
    seen: list[tuple[DeadLetter, Decision]] = []
    held: list[AbstractIncomingMessage] = []
    try:
        queue = await channel.declare_queue(topology.dead_letter_queue, durable=True)
        count = int(queue.declaration_result.message_count or 0)
        if limit is not None:
            count = min(count, limit)
        got: list[tuple[AbstractIncomingMessage, DeadLetter]] = []
        for _ in range(count):
            msg = await queue.get(no_ack=False, fail=False)
            if msg is None:
                break
            job_id, job_type, error = _parse(msg.body)
            got.append((msg, DeadLetter(job_id, job_type, error, None, msg.body)))
        ids = [d.job_id for _, d in got if d.job_id is not None]
        async with pool.acquire() as conn:
            statuses = await store.job_status_many(conn, ids) if ids else {}
            for msg, dl in got:
                if dl.job_id is not None:
                    dl.status = statuses.get(dl.job_id)
                decision = decide(dl)
                if decision == "redrive" and dl.job_id is not None:
                    async with conn.transaction():
                        await store.job_redrive(conn, [dl.job_id])
                        await store.outbox_notify(conn)
                if decision in ("drop", "redrive"):
                    await msg.ack()
                else:
                    held.append(msg)
                seen.append((dl, decision))
    finally:
        for msg in held:
            with contextlib.suppress(Exception):
                await msg.nack(requeue=True)
        with contextlib.suppress(Exception):
            await channel.close()
    return seen


def selector(
    ids: set[uuid.UUID] | None, job_type: str | None, everything: bool
) -> Callable[[DeadLetter], bool]:
    def match(dl: DeadLetter) -> bool:
        if everything:
            return True
        if ids and dl.job_id in ids:
            return True
        return job_type is not None and dl.job_type == job_type

    return match


def redrive_decision(match: Callable[[DeadLetter], bool]) -> Callable[[DeadLetter], Decision]:
    def decide(dl: DeadLetter) -> Decision:
        if dl.stale:
            return "drop"
        if not match(dl):
            return "keep"
        return "redrive" if dl.job_id is not None and dl.status is not None else "keep"

    return decide


def purge_decision(match: Callable[[DeadLetter], bool]) -> Callable[[DeadLetter], Decision]:
    def decide(dl: DeadLetter) -> Decision:
        return "drop" if dl.stale or match(dl) else "keep"

    return decide
