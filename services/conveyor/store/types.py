"""Job types: the ones workers (or a deploy step) registered, with their handlers' defaults.
The API and ``enqueue()`` accept only these (see ``conveyor.job_types``)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Connection, Statements
from .registry import statement
from .rows import JobType, JobTypeDefaults

JOB_TYPE_REGISTER_MANY = statement(
    "job_type_register_many",
    """
INSERT INTO __schema__.job_types AS t (name, max_retries, timeout_seconds, retry_delays,
                                       concurrency, rate_limit, rate_period)
SELECT u.name, u.max_retries, u.timeout_seconds,
       CASE WHEN u.retry_delays = '' THEN NULL
            ELSE string_to_array(u.retry_delays, ',')::int4[] END,
       u.concurrency, u.rate_limit, u.rate_period
FROM unnest($1::text[], $2::int4[], $3::float8[], $4::text[], $5::int4[], $6::int4[], $7::int4[])
    AS u(name, max_retries, timeout_seconds, retry_delays, concurrency, rate_limit, rate_period)
ORDER BY u.name
ON CONFLICT (name) DO UPDATE SET
    max_retries = EXCLUDED.max_retries, timeout_seconds = EXCLUDED.timeout_seconds,
    retry_delays = EXCLUDED.retry_delays, last_seen = now(),
    -- the handler's limits, unless an operator set the type's limits at run time
    concurrency = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.concurrency
                       ELSE t.concurrency END,
    rate_limit = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.rate_limit ELSE t.rate_limit END,
    rate_period = CASE WHEN t.limits_set_at IS NULL THEN EXCLUDED.rate_period
                       ELSE t.rate_period END
""",
)

JOB_TYPE_NAMES = statement(
    "job_type_names",
    "SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM __schema__.job_types",
)

JOB_TYPE_LIST = statement(
    "job_type_list",
    """
SELECT name, max_retries, timeout_seconds, retry_delays, first_seen, last_seen, paused,
       concurrency, rate_limit, rate_period, limits_set_at,
       (SELECT count(*) FROM __schema__.jobs j
        WHERE j.job_type = t.name AND j.status = 'IN_PROGRESS')::int AS running
FROM __schema__.job_types t ORDER BY name
""",
)


class TypeStatements(Statements):
    async def job_type_register_many(
        self, conn: Connection, types: Sequence[JobTypeDefaults]
    ) -> None:
        """Insert or refresh (defaults, ``last_seen``) the given types, in name order so that
        workers starting together never deadlock."""
        await conn.execute(
            self.sql[JOB_TYPE_REGISTER_MANY],
            [t.name for t in types],
            [t.max_retries for t in types],
            [t.timeout_seconds for t in types],
            [",".join(str(d) for d in t.retry_delays or ()) for t in types],
            [t.concurrency for t in types],
            [t.rate_limit for t in types],
            [t.rate_period for t in types],
        )

    async def job_type_names(self, conn: Connection) -> frozenset[str]:
        return frozenset(await conn.fetchval(self.sql[JOB_TYPE_NAMES]))

    async def job_type_list(self, conn: Connection) -> list[JobType]:
        rows = await conn.fetch(self.sql[JOB_TYPE_LIST])
        return [
            JobType(
                name=r["name"],
                max_retries=r["max_retries"],
                timeout_seconds=r["timeout_seconds"],
                retry_delays=tuple(r["retry_delays"] or ()),
                first_seen=r["first_seen"],
                last_seen=r["last_seen"],
                paused=r["paused"],
                concurrency=r["concurrency"],
                rate_limit=r["rate_limit"],
                rate_period=r["rate_period"],
                limits_set_at=r["limits_set_at"],
                running=r["running"],
            )
            for r in rows
        ]
