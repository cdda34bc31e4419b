"""The fault suite's referee.

Three sources of truth are compared once the system is quiet:

- the ids the test saw accepted (a ``201``, or an ``enqueue`` that committed);
- PostgreSQL: every job's final status and ``attempts``, plus an audit trail of every change to
  ``status``/``attempts``/``result`` recorded by a trigger the suite installs in the test database
  (``fault_audit``) — so a second ``COMPLETED`` transition, or a late write by a superseded
  attempt, cannot hide behind a final row that merely looks right;
- the handlers' ledger (see ``apps.py``): which attempts started and which ran to completion.

Figures:

- lost: accepted jobs that are missing or not terminal;
- stuck: any row still PENDING/SCHEDULED/IN_PROGRESS/RETRYING;
- double_completed: jobs with more than one transition into COMPLETED, any write after it, a
  completed attempt that is not the final ``attempts`` (fencing violated), a stored result from
  another attempt, or a completion the handler never finished;
- executed: attempts the handlers started; duplicates_executed: handler completions beyond the
  first per job (allowed: execution is at-least-once).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from .. import db as tdb

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})

AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS public.fault_audit (
    seq bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    old_status text,
    new_status text NOT NULL,
    attempts int NOT NULL,
    result jsonb,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    xact bigint NOT NULL DEFAULT txid_current()
);
CREATE OR REPLACE FUNCTION fault_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.fault_audit (job_id, old_status, new_status, attempts, result)
        VALUES (NEW.id, NULL, NEW.status::text, NEW.attempts, NEW.result);
    ELSIF NEW.status IS DISTINCT FROM OLD.status OR NEW.attempts IS DISTINCT FROM OLD.attempts
          OR NEW.result IS DISTINCT FROM OLD.result THEN
        INSERT INTO public.fault_audit (job_id, old_status, new_status, attempts, result)
        VALUES (NEW.id, OLD.status::text, NEW.status::text, NEW.attempts, NEW.result);
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS fault_audit ON jobs;
CREATE TRIGGER fault_audit AFTER INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION fault_audit_row();
"""

# Every verdict of the session, printed again in the terminal summary (see conftest.py).
VERDICTS: list[Verdict] = []


async def install_audit(db_url: str) -> None:
    conn = await tdb.connect(db_url, timeout=10)
    try:
        await conn.execute(AUDIT_SQL)
    finally:
        await conn.close()


@dataclass(frozen=True)
class Entry:
    what: str
    job_id: uuid.UUID
    attempt: int
    pid: int


class Ledger:
    """The handlers' side-effect file (one per test)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def __str__(self) -> str:
        return str(self.path)

    def entries(self) -> list[Entry]:
        out: list[Entry] = []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append(Entry(parts[0], uuid.UUID(parts[1]), int(parts[2]), int(parts[3])))
        return out

    def count(self, what: str, job_id: uuid.UUID | None = None) -> int:
        return sum(1 for e in self.entries() if e.what == what and job_id in (None, e.job_id))


@dataclass
class Verdict:
    label: str
    total: int = 0
    accepted: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    stuck: int = 0
    double_completed: int = 0
    executed: int = 0
    duplicates_executed: int = 0
    outbox_left: int = 0
    waited: float = 0.0
    problems: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        statuses = " ".join(f"{k}={v}" for k, v in sorted(self.by_status.items()))
        extra = "".join(f" {k}={v}" for k, v in self.extra.items())
        return (
            f"[faults] {self.label}: total={self.total} accepted={self.accepted} "
            f"lost={self.lost} stuck={self.stuck} double_completed={self.double_completed} "
            f"executed={self.executed} duplicates_executed={self.duplicates_executed} "
            f"({statuses}) outbox_left={self.outbox_left} settled_in={self.waited:.1f}s{extra}"
        )

    def assert_clean(self, *, expect: str | None = "COMPLETED") -> None:
        """0 lost, 0 stuck, 0 double-completed, no other problem; every job ``expect``."""
        assert self.lost == 0, f"{self.lost} accepted jobs lost: {self.problems[:5]}"
        assert self.stuck == 0, f"{self.stuck} jobs stuck: {self.problems[:5]}"
        assert self.double_completed == 0, (
            f"{self.double_completed} jobs completed more than once: {self.problems[:5]}"
        )
        assert not self.problems, self.problems[:10]
        if expect is not None:
            assert self.by_status == {expect: self.total}, self.by_status


async def _snapshot(conn: asyncpg.Connection) -> tuple[dict[uuid.UUID, Any], int]:
    rows = await conn.fetch(
        "SELECT id, status::text AS status, attempts, retry_count, max_retries, last_error,"
        " result::text AS result, run_at, updated_at, now() AS seen_at,"
        " (SELECT string_agg(o.destination || ':' || COALESCE(o.delay_seconds::text, '-'), ',')"
        "  FROM job_outbox o WHERE o.job_id = jobs.id) AS outbox FROM jobs"
    )
    outbox = int(await conn.fetchval("SELECT count(*) FROM job_outbox"))
    return {r["id"]: r for r in rows}, outbox


async def status_counts(db_url: str) -> Counter[str]:
    conn = await tdb.connect(db_url, timeout=10)
    try:
        rows = await conn.fetch("SELECT status::text AS s, count(*) AS n FROM jobs GROUP BY 1")
    finally:
        await conn.close()
    return Counter({r["s"]: int(r["n"]) for r in rows})


async def settle(db_url: str, accepted: Iterable[str | uuid.UUID], *, timeout: float) -> float:
    """Wait until every accepted job is terminal, no job is in flight and the outbox is empty.
    Returns the seconds waited (it returns at the deadline too: the check reports what is
    wrong)."""
    wanted = {uuid.UUID(str(i)) for i in accepted}
    started = time.monotonic()
    conn = await tdb.connect(db_url, timeout=10)
    try:
        while True:
            try:
                jobs, outbox = await _snapshot(conn)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                await conn.close()
                await asyncio.sleep(0.5)
                conn = await tdb.connect(db_url, timeout=10)
                continue
            done = (
                outbox == 0
                and wanted <= jobs.keys()
                and all(r["status"] in TERMINAL for r in jobs.values())
            )
            if done or time.monotonic() - started > timeout:
                return time.monotonic() - started
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def check(
    db_url: str,
    accepted: Iterable[str | uuid.UUID],
    ledger: Ledger | None,
    *,
    label: str,
    timeout: float = 60.0,
    quiet: float = 0.5,
) -> Verdict:
    """Settle (up to ``timeout``), stay quiet ``quiet`` seconds more (late duplicates would
    show), then count. Prints the figures and records them for the terminal summary."""
    accepted_ids = [uuid.UUID(str(i)) for i in accepted]
    v = Verdict(label, accepted=len(set(accepted_ids)))
    v.waited = await settle(db_url, accepted_ids, timeout=timeout)
    await asyncio.sleep(quiet)
    conn = await tdb.connect(db_url, timeout=10)
    try:
        jobs, v.outbox_left = await _snapshot(conn)
        audit = await conn.fetch(
            "SELECT seq, job_id, old_status, new_status, attempts, result::text AS result"
            " FROM fault_audit ORDER BY seq"
        )
    finally:
        await conn.close()

    v.total = len(jobs)
    v.by_status = dict(Counter(r["status"] for r in jobs.values()))
    for job_id in dict.fromkeys(accepted_ids):
        row = jobs.get(job_id)
        if row is None:
            v.lost += 1
            v.problems.append(f"lost: accepted job {job_id} has no row")
        elif row["status"] not in TERMINAL:
            v.lost += 1
    for job_id, row in jobs.items():
        if row["status"] not in TERMINAL:
            v.stuck += 1
            v.problems.append(
                f"stuck: {job_id} {row['status']} attempts={row['attempts']} "
                f"retry_count={row['retry_count']} run_at={row['run_at']} "
                f"updated_at={row['updated_at']} seen_at={row['seen_at']} "
                f"outbox={row['outbox']} last_error={row['last_error']!r}"
            )

    trail: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for a in audit:
        trail[a["job_id"]].append(a)
    entries = ledger.entries() if ledger is not None else []
    done_attempts: dict[uuid.UUID, list[int]] = defaultdict(list)
    for e in entries:
        done_attempts.setdefault(e.job_id, [])
        if e.what == "done":
            done_attempts[e.job_id].append(e.attempt)
    v.executed = sum(1 for e in entries if e.what == "start")
    v.duplicates_executed = sum(len(a) - 1 for a in done_attempts.values() if a)

    for job_id, row in jobs.items():
        reasons = _completion_problems(row, trail.get(job_id, []), done_attempts, ledger)
        if reasons:
            v.double_completed += 1
            v.problems.extend(f"double-completed: {job_id}: {r}" for r in reasons)

    VERDICTS.append(v)
    print("\n" + v.summary(), flush=True)
    return v


def _completion_problems(
    row: Any,
    trail: list[Any],
    done_attempts: dict[uuid.UUID, list[int]],
    ledger: Ledger | None,
) -> list[str]:
    reasons: list[str] = []
    into = [i for i, a in enumerate(trail) if a["new_status"] == "COMPLETED"
            and a["old_status"] != "COMPLETED"]  # fmt: skip
    if len(into) > 1:
        reasons.append(f"{len(into)} transitions into COMPLETED")
    if into:
        first = into[0]
        later = trail[first + 1 :]
        if later:
            reasons.append(
                "written after COMPLETED: "
                + ", ".join(f"{a['old_status']}->{a['new_status']}@{a['attempts']}" for a in later)
            )
        completed_attempt = trail[first]["attempts"]
        if completed_attempt != row["attempts"]:
            reasons.append(
                f"completed by attempt {completed_attempt} but attempts={row['attempts']}"
            )
    if row["status"] == "COMPLETED":
        if not into:
            reasons.append("COMPLETED without an audited transition")
        result = orjson.loads(row["result"]) if row["result"] else None
        if (
            isinstance(result, dict)
            and "attempt" in result
            and result["attempt"] != row["attempts"]
        ):
            reasons.append(
                f"result of attempt {result['attempt']} stored, attempts={row['attempts']}"
            )
        finished = done_attempts.get(row["id"])  # None: this job's handler keeps no ledger
        if ledger is not None and finished is not None and row["attempts"] not in finished:
            reasons.append(
                f"attempt {row['attempts']} recorded COMPLETED but its handler never finished "
                f"(finished: {finished})"
            )
    return reasons
