"""Job-type controls: pause, and fleet-wide concurrency and rate limits, enforced in the claim.

Types without controls never come here: the worker claims them with ``job_claim_many``
(``attempts.py``) unchanged. A batch with controlled types is claimed by ``job_claim_controlled``,
*one statement* run outside any transaction: it locks the type rows (``FOR UPDATE``, name order)
for its own duration only, so a worker frozen mid-claim (SIGSTOP, a VM pause) holds no lock: the
server commits the statement without it. Its snapshot predates the lock, so claims committed
while it waited are not in its view of ``jobs``; the locked type row is the newest version and
carries them: ``claim_ids``/``claim_attempts`` (the type's claims, pruned at each claim to those
that may still run: the snapshot shows an older attempt, or that attempt IN_PROGRESS) and
``recent_starts`` (the rate window). Running = IN_PROGRESS in the snapshot, or one of those claims.
It claims at most what the limits allow, records the claims and starts, and *holds* the rest:
touched and leased, so the reconciler counts them neither as overdue nor as fresh. A job held
only for a full concurrency limit, within ``room`` (what the worker keeps in hand), stays with
the worker (pen 0: no outbox row; claimed again when a slot frees); the others go through a
holding pen by an outbox row (held for the pen's delay plus a lease) — no retry consumed,
nothing spins hot. Pens: 5 s while paused; until the rate window frees a start for a rate
limit; 1-10 s (a quarter of the time it has waited) for a full concurrency limit."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.jobs import PEN_LADDER
from .attempts import HandlerDefaults
from .base import Connection, Statements
from .registry import bind, named
from .rows import ClaimedJob, TypeControl

JOB_CLAIM_CONTROLLED = named("job_claim_controlled")
JOB_RELEASE_HELD = named("job_release_held")
TYPE_CONTROLS = named("type_controls")
TYPE_SET_PAUSED = named("type_set_paused")
TYPE_SET_LIMITS = named("type_set_limits")


class ControlStatements(Statements):
    async def type_set_paused(self, conn: Connection, name: str, paused: bool) -> bool:
        """False when no such type."""
        return await conn.fetchval(self.sql[TYPE_SET_PAUSED], name, paused) is not None

    async def type_set_limits(
        self,
        conn: Connection,
        name: str,
        *,
        concurrency: int | None,
        rate_limit: int | None,
        rate_period: int | None,
    ) -> bool:
        """False when no such type."""
        found = await conn.fetchval(
            self.sql[TYPE_SET_LIMITS], name, concurrency, rate_limit, rate_period
        )
        return found is not None

    async def type_controls(self, conn: Connection) -> list[TypeControl]:
        rows = await conn.fetch(self.sql[TYPE_CONTROLS])
        return [
            TypeControl(r["name"], r["paused"], r["concurrency"], r["rate_limit"], r["rate_period"])
            for r in rows
        ]

    async def job_release_held(self, conn: Connection, ids: Sequence[uuid.UUID]) -> None:
        """Give back jobs held in hand: each through the shortest pen, its hold dropped."""
        await conn.execute(self.sql[JOB_RELEASE_HELD], list(ids))

    async def job_claim_controlled(
        self,
        conn: Connection,
        ids: Sequence[uuid.UUID],
        *,
        lease_seconds: float,
        worker_id: str,
        types: Sequence[str],
        handler_defaults: HandlerDefaults | Mapping[str, Mapping[str, Any]],
        default_max_retries: int,
        room: Mapping[str, int] | None = None,
    ) -> tuple[list[ClaimedJob], dict[uuid.UUID, int]]:
        """One statement (no transaction around it): claim what the limits allow among
        ``ids``; returns the claimed jobs, and the held ones (id → pen seconds; 0: held in the
        caller's hand, at most ``room[type]`` of each type, leased for ``lease_seconds``)."""
        if not isinstance(handler_defaults, HandlerDefaults):
            handler_defaults = HandlerDefaults.of(handler_defaults)
        values = {
            "ids": list(ids),
            "lease_seconds": lease_seconds,
            "worker_id": worker_id,
            "handler_defaults": handler_defaults.json,
            "default_max_retries": default_max_retries,
            "types": list(types),
            "pen_ladder": list(PEN_LADDER),
            "room": [(room or {}).get(t, 0) for t in types],
        }
        name = JOB_CLAIM_CONTROLLED
        rows = await conn.fetch(self.sql[name], *bind(name, values))
        claimed = [ClaimedJob.from_record(r) for r in rows if not r["held"]]
        return claimed, {r["id"]: int(r["wait"]) for r in rows if r["held"]}
