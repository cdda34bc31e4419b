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
from .attempts import HandlerDefaults, claimable
from .base import Connection, Statements
from .registry import statement
from .rows import ClaimedJob, TypeControl

PAUSED_HOLD_SECONDS = 5

_CLAIMABLE = claimable("j")

JOB_CLAIM_CONTROLLED = statement(
    "job_claim_controlled",
    f"""
WITH t AS (
    -- the type rows, locked for this statement only, in name order; a locking read returns a
    -- row's newest version, so the claims and starts recorded there are exact even when they
    -- were committed after this statement's snapshot was taken
    SELECT name, paused, concurrency, rate_limit, rate_period, claim_ids, claim_attempts,
           ARRAY(SELECT s FROM unnest(recent_starts) s
                 WHERE rate_period IS NOT NULL
                   AND s > statement_timestamp() - make_interval(secs => rate_period)
                 ORDER BY s) AS win
    FROM __schema__.job_types WHERE name = ANY($6::text[]) ORDER BY name FOR UPDATE
), listed AS (
    -- claims recorded on the type row that may still run: the snapshot shows an older attempt
    -- (claimed after it was taken) or that attempt still IN_PROGRESS
    SELECT t.name, e.id, e.att FROM t, unnest(t.claim_ids, t.claim_attempts) AS e(id, att)
    JOIN __schema__.jobs r ON r.id = e.id
    WHERE r.attempts < e.att OR (r.attempts = e.att AND r.status = 'IN_PROGRESS')
), c AS (
    SELECT t.*,
           t.concurrency - (SELECT count(DISTINCT x.id) FROM (
                                SELECT r.id FROM __schema__.jobs r
                                WHERE r.job_type = t.name AND r.status = 'IN_PROGRESS'
                                UNION ALL SELECT l.id FROM listed l WHERE l.name = t.name) x
                            ) AS conc_free,
           t.rate_limit - cardinality(t.win) AS rate_free,
           ($8::int4[])[array_position($6::text[], t.name)] AS room
    FROM t
), cand AS (
    SELECT j.id, j.job_type, j.run_at, j.created_at,
           row_number() OVER (PARTITION BY j.job_type ORDER BY j.priority DESC, j.id) AS rn
    FROM __schema__.jobs j
    WHERE j.id = ANY($1::uuid[]) AND array_position($6::text[], j.job_type) IS NOT NULL
      AND {_CLAIMABLE}
), pick AS (
    SELECT cand.*, c.paused, c.conc_free, c.rate_free, c.rate_limit, c.rate_period, c.win,
           coalesce(c.room, 0) AS room,
           (NOT coalesce(c.paused, false) AND cand.rn <= coalesce(least(c.conc_free, c.rate_free),
                                                                  cand.rn)) AS go
    FROM cand LEFT JOIN c ON c.name = cand.job_type
), upd AS (
    UPDATE __schema__.jobs j SET
        status = 'IN_PROGRESS',
        attempts = j.attempts + 1,
        started_at = statement_timestamp(),
        updated_at = statement_timestamp(),
        lease_expires_at = statement_timestamp() + make_interval(secs => $2),
        worker_id = $3,
        max_retries = COALESCE(j.max_retries, ($4::jsonb -> j.job_type ->> 'max_retries')::int, $5),
        timeout_seconds = COALESCE(j.timeout_seconds,
                                   ($4::jsonb -> j.job_type ->> 'timeout')::float8)
    FROM pick
    WHERE j.id = pick.id AND pick.go AND {_CLAIMABLE}
    RETURNING j.id, j.job_type, j.payload::text AS payload, j.priority, j.attempts,
              j.retry_count, j.max_retries, j.timeout_seconds, j.meta::text AS meta,
              j.trace_context,
              greatest(0, extract(epoch FROM statement_timestamp()
                                              - COALESCE(j.run_at, j.created_at)))::float8 AS wait
), keep AS (
    SELECT name, id, att FROM listed UNION ALL SELECT job_type, id, attempts FROM upd
), starts AS (
    UPDATE __schema__.job_types ty
    SET recent_starts = CASE WHEN c.rate_limit IS NULL THEN ty.recent_starts
                             ELSE c.win || array_fill(statement_timestamp(), ARRAY[n.n]) END,
        claim_ids = CASE WHEN c.concurrency IS NULL THEN '{{}}'
                         ELSE ARRAY(SELECT k.id FROM keep k WHERE k.name = ty.name
                                    ORDER BY k.id) END,
        claim_attempts = CASE WHEN c.concurrency IS NULL THEN '{{}}'
                              ELSE ARRAY(SELECT k.att FROM keep k WHERE k.name = ty.name
                                         ORDER BY k.id) END
    FROM (SELECT job_type, count(*)::int AS n FROM upd GROUP BY job_type) n, c
    WHERE ty.name = n.job_type AND c.name = ty.name
      AND (c.rate_limit IS NOT NULL OR c.concurrency IS NOT NULL)
), hold AS (
    -- the n-th job over a full window waits for the window's (size - limit + n)-th start to
    -- leave it (the starts claimed just now included: when that index is past the window)
    SELECT pick.id, (pick.rate_free IS NOT NULL AND pick.rn > pick.rate_free) AS rate_held,
        -- held for a full concurrency limit only, within the room the worker has: kept in its
        -- hand (no pen) and claimed again as soon as a slot frees
        (NOT coalesce(pick.paused, false) AND pick.conc_free IS NOT NULL
         AND pick.rn > pick.conc_free
         AND (pick.rate_free IS NULL OR pick.rn <= pick.rate_free)
         AND pick.rn - greatest(pick.conc_free, 0) <= pick.room) AS in_hand,
        greatest(
        CASE WHEN pick.paused THEN {PAUSED_HOLD_SECONDS} ELSE 1 END,
        CASE WHEN pick.conc_free IS NOT NULL AND pick.rn > pick.conc_free
             THEN least(10, extract(epoch FROM statement_timestamp()
                                                - COALESCE(pick.run_at, pick.created_at)) / 4)
             ELSE 0 END,
        CASE WHEN pick.rate_free IS NOT NULL AND pick.rn > pick.rate_free
             THEN extract(epoch FROM COALESCE(
                 pick.win[(cardinality(pick.win) - pick.rate_limit + pick.rn)::int]
                     + make_interval(secs => pick.rate_period),
                 statement_timestamp() + make_interval(secs => pick.rate_period))
                 - statement_timestamp())
             ELSE 0 END) AS wait_for
    FROM pick WHERE NOT pick.go
), pen AS (
    SELECT hold.*, CASE WHEN hold.in_hand THEN 0 ELSE
        coalesce((SELECT min(p) FROM unnest($7::int4[]) p WHERE p >= hold.wait_for),
                 {PEN_LADDER[-1]}) END AS delay
    FROM hold
), held AS (
    -- a job held for its rate window (a pen of up to the window's length) is not due before
    -- the pen hands it back: the reconciler, which re-publishes jobs due for longer than
    -- reconcile_after and missing from their queue, must not take it for lost (it would add
    -- a copy per pass); short holds (pause, concurrency: <= 10 s) keep their run_at. The
    -- claimable test again: a job another claimer took meanwhile is left alone.
    UPDATE __schema__.jobs j SET updated_at = statement_timestamp(),
        lease_expires_at = statement_timestamp() + make_interval(secs => pen.delay + $2),
        run_at = CASE WHEN pen.rate_held
                      THEN statement_timestamp() + make_interval(secs => pen.delay)
                      ELSE j.run_at END
    FROM pen
    WHERE j.id = pen.id AND {_CLAIMABLE}
    RETURNING j.id, j.job_type, j.priority, pen.delay
), ob AS (
    INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds)
    SELECT id, job_type, priority, 'retry', delay FROM held WHERE delay > 0
)
SELECT false AS held, id, job_type, payload, priority, attempts, retry_count, max_retries,
       timeout_seconds, meta, trace_context, wait FROM upd
UNION ALL
SELECT true, id, job_type, NULL, priority, NULL, NULL, NULL, NULL, NULL, NULL, delay FROM held
""",
)

# Jobs a worker held in hand for a concurrency slot and gives up (its drain): back through the
# shortest pen, their hold dropped so the reconciler treats them as any other job again.
JOB_RELEASE_HELD = statement(
    "job_release_held",
    f"""
WITH r AS (
    UPDATE __schema__.jobs j SET lease_expires_at = NULL, updated_at = now()
    WHERE j.id = ANY($1::uuid[]) AND {claimable("j")}
    RETURNING j.id, j.job_type, j.priority
)
INSERT INTO __schema__.job_outbox (job_id, job_type, priority, destination, delay_seconds)
SELECT id, job_type, priority, 'retry', {PEN_LADDER[0]} FROM r
""",
)

TYPE_CONTROLS = statement(
    "type_controls",
    """
SELECT name, paused, concurrency, rate_limit, rate_period FROM __schema__.job_types
ORDER BY name
""",
)


TYPE_SET_PAUSED = statement(
    "type_set_paused",
    "UPDATE __schema__.job_types SET paused = $2 WHERE name = $1 RETURNING name",
)

# An operator's limits: registering workers keep them from now on (``limits_set_at``).
TYPE_SET_LIMITS = statement(
    "type_set_limits",
    """
UPDATE __schema__.job_types SET concurrency = $2, rate_limit = $3, rate_period = $4,
    limits_set_at = now(),
    recent_starts = CASE WHEN $3::int4 IS NULL THEN '{}' ELSE recent_starts END
WHERE name = $1 RETURNING name
""",
)


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
        rows = await conn.fetch(
            self.sql[JOB_CLAIM_CONTROLLED],
            list(ids),
            lease_seconds,
            worker_id,
            handler_defaults.json,
            default_max_retries,
            list(types),
            list(PEN_LADDER),
            [(room or {}).get(t, 0) for t in types],
        )
        claimed = [ClaimedJob.from_record(r) for r in rows if not r["held"]]
        return claimed, {r["id"]: int(r["wait"]) for r in rows if r["held"]}
