"""Admission's guarantees under faults, with real ``conveyor worker`` processes
(``admission_app.py``'s handlers) that are SIGKILLed and SIGSTOPped.

A job of a limited or partitioned type waits WAITING until ``admit`` makes it PENDING
(``store/sql/schema/admission.sql``); a worker's outcome admits in its own transaction, the duty
holder's admission duty every 0.05 s. What each test holds:

1. *Exact under faults*: a ``partition_concurrency=1`` type (200 keys, 4 jobs each) and a type
   with ``concurrency=3``, three workers, one SIGKILLed (and replaced), another SIGSTOPped past
   its lease: a sampler every 100 ms never sees a key with two jobs IN_PROGRESS, nor more
   admitted (PENDING + IN_PROGRESS) than its limit; every job COMPLETED once (the checker, and
   ``job_attempts``); no claim without an admission; handler bodies of one key overlap only
   where one of them is the frozen worker's, run past its lease (documented: the lease is the
   reservation, a frozen body cannot be stopped from outside).
2. *Frozen admitter*: the duty holder SIGSTOPped for longer than the bound: another worker takes
   the duties over, jobs submitted during the freeze start before it ends, no key with room
   waits longer than the bound (below); nothing admitted past a limit, no second claim of one
   admission. A worker paused *inside* its outcome transaction just after its ``admit`` (the
   one admitter inside a transaction) holds the type's advisory lock: briefly, the others wait
   for it and admit nothing beside what it admitted (a higher-priority job submitted for such a
   key meanwhile included); frozen, the session bound ends it and the type's keys are admitted
   again within that bound.
3. *Dead admitter*: the duty holder SIGKILLed: another process takes the duties over at its next
   election turn, admission goes on within the bound.
4. *A retry does not bypass admission*: a first attempt that raises on a ``partition_concurrency=1``
   type waits WAITING for its retry (never RETRYING, no outbox row for a holding pen, the pen
   never declared) and never runs beside its key's other jobs.
5. *An application's open transaction* holding a waiting job's row (a debounced submit folded
   into it) stalls neither its type's other keys nor the duty's other types (admission leaves a
   locked row for a later pass), and the job is not admitted before the run_at the fold set.

The bound of 2 and 3 (``bound``): a key with room and waiting jobs gets one started within two
leases plus the duties' takeover. The takeover, from ``cli/duties.py``: a frozen holder keeps the
election's session until ``idle_session_timeout`` (``IDLE_TURNS`` turns) ends it, a standby tries
the lock at its next turn (one more turn), then starts the relay and the sweeper (``START``); a
killed holder's session ends with its process, so only the turn and the start count. The two
leases: a job the holder had claimed is its own until its lease runs out and a pass of lease
recovery (the new holder's) sends it back to admission, with a pen delay of one or two seconds,
and a delivery it had prefetched waits for the broker to hear no AMQP heartbeat.

``-m soak``: test 1 with ``ADMISSION_SCALE`` (5) times the keys and rounds of faults; test 2
with a 60 s freeze and the default election turn."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from conveyor import JobSpec, enqueue, enqueue_many
from conveyor.cli.duties import IDLE_TURNS, TICK
from conveyor.core.config import Settings
from conveyor.jobs.types import register_router_types

from .. import db as tdb
from .admission_app import router
from .checker import Ledger, check
from .harness import (
    Proc,
    WorkerFleet,
    component_env,
    queue_ready,
    running,
    topology,
    wait_until,
    worker_proc,
)

APP = "tests.faults.admission_app:router"
KEYED, CAPPED, FLAKY, QUIET = "adm_keyed", "adm_capped", "adm_flaky", "adm_quiet"
LIMITS = {
    KEYED: 1,
    CAPPED: 3,
    FLAKY: 1,
    QUIET: 2,
}  # jobs of one key at once ('' for the whole type)
LEASE = 5.0  # CONVEYOR_VISIBILITY_TIMEOUT of these tests
START = 4.0  # a new holder's relay and sweeper connect and pass (a loaded machine)
FREEZE = LEASE + 5.0  # test 1's freeze: past the lease, and the next job of a key started
SCALE = int(os.environ.get("ADMISSION_SCALE", "5"))  # the soaks' multiplier


# --------------------------------------------------------------------------- watching


@dataclass
class Sampler:
    """Every 100 ms, one statement: the keys with more than one job admitted or running (the
    limits are checked here, so a 3-limit type shows its keys' counts too)."""

    url: str
    types: Sequence[str]
    samples: int = 0
    over: list[str] = field(default_factory=list)  # the violations seen
    peak: Counter[str] = field(default_factory=Counter)  # per type, the most running of a key

    SQL = (
        "SELECT job_type, partition_key AS key, count(*) AS admitted, "
        "count(*) FILTER (WHERE status = 'IN_PROGRESS') AS running FROM jobs "
        "WHERE job_type = ANY($1::text[]) AND status IN ('PENDING', 'IN_PROGRESS') "
        "GROUP BY 1, 2 HAVING count(*) > 1"
    )

    async def run(self, stop: asyncio.Event) -> None:
        conn = await tdb.connect(self.url, timeout=10)
        try:
            while not stop.is_set():
                for r in await conn.fetch(self.SQL, list(self.types)):
                    limit = LIMITS[r["job_type"]]
                    self.peak[r["job_type"]] = max(self.peak[r["job_type"]], r["running"])
                    if r["admitted"] > limit or r["running"] > limit:
                        self.over.append(
                            f"{time.time():.3f} {r['job_type']} key={r['key']!r} "
                            f"admitted={r['admitted']} running={r['running']}"
                        )
                self.samples += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def sampling(url: str, types: Sequence[str]) -> Any:
    sampler, stop = Sampler(url, types), asyncio.Event()
    task = asyncio.create_task(sampler.run(stop))
    try:
        yield sampler
    finally:
        stop.set()
        await task


@dataclass(frozen=True)
class Event:
    at: float  # clock_timestamp() of the row change
    seq: int
    job_id: uuid.UUID
    job_type: str
    key: str
    old: str | None
    new: str
    attempts: int


async def _events(conn: asyncpg.Connection, types: Sequence[str]) -> list[Event]:
    """The audit trail (``checker.install_audit``) of the types' jobs, in time order."""
    rows = await conn.fetch(
        "SELECT extract(epoch FROM a.at)::float8 AS at, a.seq, a.job_id, j.job_type, "
        "j.partition_key AS key, a.old_status AS old, a.new_status AS new, a.attempts "
        "FROM fault_audit a JOIN jobs j ON j.id = a.job_id "
        "WHERE j.job_type = ANY($1::text[]) ORDER BY a.at, a.seq",
        list(types),
    )
    return [Event(**dict(r)) for r in rows]


def claims_without_admission(events: Iterable[Event]) -> list[str]:
    """Every claim (attempts counted up, IN_PROGRESS) must follow its own admission
    (WAITING → PENDING): two claims of one admission would be two runs under one slot. A job of
    these types inserted other than WAITING bypassed admission."""
    problems: list[str] = []
    trail: dict[uuid.UUID, list[Event]] = defaultdict(list)
    for e in events:
        trail[e.job_id].append(e)
    for job_id, evs in trail.items():
        evs.sort(key=lambda e: e.seq)
        admitted, attempts = False, 0
        for e in evs:
            if e.old is None and e.new != "WAITING":
                problems.append(f"{job_id}: inserted {e.new}, not WAITING")
            if e.old == "WAITING" and e.new == "PENDING":
                admitted = True
            if e.new == "IN_PROGRESS" and e.attempts > attempts:
                if not admitted:
                    problems.append(f"{job_id}: attempt {e.attempts} claimed without an "
                                    f"admission since the last claim")  # fmt: skip
                admitted = False
            if e.new == "RETRYING":
                problems.append(f"{job_id}: RETRYING (a retry outside admission)")
            attempts = e.attempts
    return problems


async def attempt_problems(conn: asyncpg.Connection, types: Sequence[str]) -> list[str]:
    """``job_attempts``: no job with two ``completed`` outcomes, and every finished job has one
    row per attempt its ``attempts`` counts (a claim that left no row was overwritten by a
    second claim)."""
    rows = await conn.fetch(
        "SELECT j.id, j.status::text AS status, j.attempts, "
        "COALESCE(array_agg(a.attempt ORDER BY a.attempt) FILTER (WHERE a.attempt IS NOT NULL), "
        "'{}') AS rows, count(*) FILTER (WHERE a.outcome = 'completed') AS completed "
        "FROM jobs j LEFT JOIN job_attempts a ON a.job_id = j.id "
        "WHERE j.job_type = ANY($1::text[]) GROUP BY 1, 2, 3",
        list(types),
    )
    problems = []
    for r in rows:
        if r["completed"] > 1:
            problems.append(f"{r['id']}: {r['completed']} completed attempts")
        if r["status"] in ("COMPLETED", "FAILED") and list(r["rows"]) != list(
            range(1, r["attempts"] + 1)
        ):
            problems.append(f"{r['id']}: attempts={r['attempts']}, attempt rows {r['rows']}")
    return problems


@dataclass
class Gap:
    seconds: float = 0.0
    where: str = ""


def longest_gaps(events: Iterable[Event]) -> tuple[Gap, Gap]:
    """Per key, from the audit trail: the longest time it had room and waiting jobs but admitted
    none (``admission``: WAITING > 0 and admitted < limit), and the longest it had room and
    admitted or waiting jobs but started none (``start``: WAITING + PENDING > 0 and IN_PROGRESS <
    limit: a job's wait from its submit, or from the end of its key's last run, to its start).
    A job in a pen's delay counts as waiting (one or two seconds)."""
    status: dict[uuid.UUID, str] = {}
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    since: dict[tuple[str, str, str], float] = {}
    worst = {"admission": Gap(), "start": Gap()}
    for e in events:
        k = (e.job_type, e.key)
        if e.job_id in status:
            counts[k][status[e.job_id]] -= 1
        status[e.job_id] = e.new
        counts[k][e.new] += 1
        c, limit = counts[k], LIMITS[e.job_type]
        now = {
            "admission": c["WAITING"] > 0 and c["PENDING"] + c["IN_PROGRESS"] < limit,
            "start": c["WAITING"] + c["PENDING"] > 0 and c["IN_PROGRESS"] < limit,
        }
        for what, on in now.items():
            began = since.get((*k, what))
            if on and began is None:
                since[(*k, what)] = e.at
            elif not on and began is not None:
                del since[(*k, what)]
                if e.at - began > worst[what].seconds:
                    worst[what] = Gap(e.at - began, f"{e.job_type} key={e.key!r} from {began:.3f}")
    for (job_type, key, what), began in since.items():  # still open: ends now
        worst[what] = max(worst[what], Gap(time.time() - began, f"{job_type} key={key!r} open"),
                          key=lambda g: g.seconds)  # fmt: skip
    return worst["admission"], worst["start"]


@dataclass(frozen=True)
class Span:
    job: str
    attempt: int
    pid: int
    key: str
    begin: float
    end: float | None
    how: str


def spans(path: Path) -> list[Span]:
    """The handler bodies ``admission_app`` recorded (``begin`` / ``end`` lines)."""
    begun: dict[tuple[str, int, int], tuple[str, float]] = {}
    out: list[Span] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        what, job, attempt, pid, key, t, *how = line.split()
        ident = (job, int(attempt), int(pid))
        if what == "begin":
            begun[ident] = (key, float(t))
        elif what == "end" and ident in begun:
            key, t0 = begun.pop(ident)
            out.append(Span(job, int(attempt), int(pid), key, t0, float(t), how[0]))
    out += [Span(j, a, p, k, t0, None, "gone") for (j, a, p), (k, t0) in begun.items()]
    return out


def overlaps(found: list[Span], died: dict[int, float]) -> list[tuple[Span, Span]]:
    """Pairs of bodies of one key running at the same time. A body with no end was killed with
    its process (``died``: pid → when)."""

    def end(s: Span) -> float:
        return s.end if s.end is not None else died.get(s.pid, float("inf"))

    by_key: dict[str, list[Span]] = defaultdict(list)
    for s in found:
        if s.key != "-":  # a keyed type's body (a capped type's have no key: peak_bodies)
            by_key[s.key].append(s)
    pairs = []
    for group in by_key.values():
        group.sort(key=lambda s: s.begin)
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                if b.begin >= end(a):
                    break
                pairs.append((a, b))
    return pairs


def peak_bodies(found: Iterable[Span], died: dict[int, float]) -> int:
    """The most bodies running at once."""
    edges = []
    for s in found:
        edges += [(s.begin, 1), (s.end if s.end is not None else died.get(s.pid, 1e12), -1)]
    running = peak = 0
    for _, step in sorted(edges):
        running += step
        peak = max(peak, running)
    return peak


def _said(s: Span) -> str:
    return f"{s.job} #{s.attempt} pid {s.pid} {s.begin:.3f}-{s.end} {s.how}"


def _pid_of(worker_id: str | None) -> int:
    return int((worker_id or "::").split(":")[1] or 0)


async def _running_by_pid(conn: asyncpg.Connection) -> Counter[int]:
    rows = await conn.fetch("SELECT worker_id FROM jobs WHERE status = 'IN_PROGRESS'")
    return Counter(_pid_of(r["worker_id"]) for r in rows)


def _state(pid: int) -> str:
    """A process's state letter (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _settings(base: Settings, **overrides: Any) -> Settings:
    """The fault suite's fast clocks with a 5 s lease; the API waits up to 10 s for PostgreSQL
    (it shares two loaded cores with three workers); small pools (the server's 100 connections
    are shared by every test running)."""
    update = {"visibility_timeout": LEASE, "db_timeout": 10.0, "db_pool_size": 4}
    return base.model_copy(update={**update, **overrides})


async def _register(url: str) -> None:
    conn = await tdb.connect(url, timeout=10)
    try:
        await register_router_types(conn, router)
    finally:
        await conn.close()


def _payload(ledger: Ledger, span_file: Path, rng: random.Random, **kw: Any) -> dict[str, Any]:
    return {"ledger": str(ledger), "spans": str(span_file),
            "sleep": round(rng.uniform(0.05, 0.2), 3), **kw}  # fmt: skip


async def _final_checks(url: str, types: Sequence[str]) -> tuple[list[Event], list[str]]:
    conn = await tdb.connect(url, timeout=10)
    try:
        events = await _events(conn, types)
        problems = claims_without_admission(events) + await attempt_problems(conn, types)
    finally:
        await conn.close()
    return events, problems


# --------------------------------------------------------------------------- 1. exact under faults


async def _exact_under_faults(
    settings: Settings, ledger: Ledger, tmp_path: Path, *, keys: int, per_key: int, rounds: int
) -> None:
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    rng = random.Random(seed)
    span_file = tmp_path / "spans.txt"
    url = settings.database_url
    await _register(url)
    died: dict[int, float] = {}
    frozen: list[tuple[int, float, float]] = []  # (pid, stopped at, continued at)
    async with running(settings) as stack, sampling(url, [KEYED, CAPPED]) as sampler:
        fleet = WorkerFleet(settings, tmp_path, 3, concurrency=4, app=APP)
        await fleet.ready(60)
        conn = await tdb.connect(url, timeout=10)
        stop = asyncio.Event()
        supervisor = asyncio.create_task(fleet.supervise(stop))
        try:
            capped_jobs = [_payload(ledger, span_file, rng) for _ in range(20 * rounds * per_key)]
            keyed = [_payload(ledger, span_file, rng, acct=f"a{k:04d}")
                     for _ in range(per_key) for k in range(keys)]  # fmt: skip
            for start in range(0, len(keyed), 500):
                await stack.submit_batch(KEYED, keyed[start : start + 500])
            await stack.submit_batch(CAPPED, capped_jobs)
            total = len(keyed) + len(capped_jobs)
            share = 0.0

            async def done() -> bool:
                n = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'COMPLETED'")
                return bool(n >= share * total)

            for r in range(rounds):
                share = (r + 0.2) / (rounds + 0.5)  # a kill and a freeze, spread over the run
                await wait_until(done, timeout=120, interval=0.2, what="jobs completing")
                before = list(fleet.slots)
                victim = await fleet.kill_one(rng)
                died[victim.pid] = time.time()
                await asyncio.sleep(1.0)
                # freeze the worker (not the victim's replacement) running the most jobs
                by_pid = await _running_by_pid(conn)
                old = [p for p in before if p is not victim and p.alive()]
                target = max(old, key=lambda p: by_pid[p.pid])
                held = by_pid[target.pid]
                stopped_at = time.time()
                target.signal(signal.SIGSTOP)
                await asyncio.sleep(FREEZE)
                target.signal(signal.SIGCONT)
                frozen.append((target.pid, stopped_at, time.time()))
                print(f"[admission] round {r}: killed {victim.pid}; froze {target.pid} with "
                      f"{held} jobs running for {FREEZE:.0f} s")  # fmt: skip
            v = await check(url, stack.accepted, ledger, label="admission-exact", timeout=150)
        finally:
            stop.set()
            await supervisor
            await conn.close()
        codes = await fleet.stop()
    events, problems = await _final_checks(url, [KEYED, CAPPED])
    recovered = sum(1 for e in events if e.old == "IN_PROGRESS" and e.new == "WAITING")
    bodies = spans(span_file)
    pairs = overlaps(bodies, died)
    frozen_pids = {pid for pid, _, _ in frozen}

    def frozen_body(s: Span) -> bool:  # began before a freeze of its process, ended after
        end = s.end if s.end is not None else died.get(s.pid, float("inf"))
        return any(s.pid == pid and s.begin < t0 < end for pid, t0, _ in frozen)

    unexplained = [(a, b) for a, b in pairs if not (frozen_body(a) or frozen_body(b))]
    capped = [s for s in bodies if s.key == "-"]
    capped_peak = peak_bodies([s for s in capped if not frozen_body(s)], died)
    print(f"[admission] exact under faults (seed {seed}): {sampler.samples} samples, "
          f"{len(sampler.over)} over a limit (peak running of a key: {dict(sampler.peak)}); "
          f"{recovered} leases recovered; {len(pairs)} overlapping bodies of one key, "
          f"{len(pairs) - len(unexplained)} with a frozen worker's body {sorted(frozen_pids)}; "
          f"{CAPPED}: at most {capped_peak} bodies at once besides the frozen worker's "
          f"({peak_bodies(capped, died)} with them)")  # fmt: skip
    for a, b in pairs[:10]:
        print(f"  overlap key={a.key}: {_said(a)} / {_said(b)}")
    v.assert_clean()
    assert not sampler.over, sampler.over[:10]
    assert sampler.samples >= 50, f"only {sampler.samples} samples"
    assert not problems, problems[:10]
    assert not unexplained, [(a, b) for a, b in unexplained[:5]]
    assert capped_peak <= LIMITS[CAPPED]
    assert recovered >= 1, "no lease expired: the faults hit no running job"
    assert fleet.deaths == 0, f"workers died without being killed: {fleet.exit_codes}"
    assert codes == [0, 0, 0], codes


@pytest.mark.timeout(240)
async def test_partition_limit_is_exact_under_kills_and_freezes(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """200 keys of four jobs, 80 jobs of the capped type, an admission window of 24 (about
    twice the fleet's slots: keys wait their turn with room); one kill and one freeze."""
    settings = _settings(fsettings, admission_window=24)
    await _exact_under_faults(settings, ledger, tmp_path, keys=200, per_key=4, rounds=1)


@pytest.mark.soak
@pytest.mark.timeout(1800)
async def test_partition_limit_is_exact_under_kills_and_freezes_soak(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """``ADMISSION_SCALE`` (5) times the keys and as many rounds of a kill and a freeze."""
    settings = _settings(fsettings, admission_window=24)
    await _exact_under_faults(settings, ledger, tmp_path, keys=200 * SCALE, per_key=4, rounds=SCALE)


# --------------------------------------------------------------------------- 2, 3: the duty holder


def _tick(settings: Settings) -> float:
    """The duties' election turn (``Duties.tick``)."""
    return min(TICK, settings.outbox_stale_after / 3)


def takeover(settings: Settings, *, frozen: bool) -> float:
    """Seconds from a holder's freeze (or death) to a standby's relay and sweeper running: the
    frozen holder's election session ends ``IDLE_TURNS`` turns after its last one (a dead one's
    at once), a standby tries the lock at its next turn, then starts."""
    tick = _tick(settings)
    return (IDLE_TURNS * tick if frozen else 0.0) + tick + START


def bound(settings: Settings, *, frozen: bool) -> float:
    """The longest a key with room may wait for a start (the module's docstring)."""
    return 2 * settings.visibility_timeout + takeover(settings, frozen=frozen)


@dataclass
class Feeder:
    """Submits ``per_tick`` jobs of random keys every 100 ms with ``enqueue()``."""

    url: str
    ledger: Ledger
    span_file: Path
    rng: random.Random
    keys: int = 40
    per_tick: int = 1
    sleep: tuple[float, float] = (0.05, 0.2)  # a job's seconds, from-to
    ids: list[uuid.UUID] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        conn = await tdb.connect(self.url, timeout=10)
        try:
            while not stop.is_set():
                for _ in range(self.per_tick):
                    acct = f"a{self.rng.randrange(self.keys):03d}"
                    sleep = round(self.rng.uniform(*self.sleep), 3)
                    payload = _payload(self.ledger, self.span_file, self.rng, acct=acct,
                                       sleep=sleep)  # fmt: skip
                    self.ids.append(await enqueue(conn, KEYED, payload))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def feeding(feeder: Feeder) -> Any:
    stop = asyncio.Event()
    task = asyncio.create_task(feeder.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await task


async def _duty_workers(settings: Settings, tmp_path: Path, n: int = 3) -> tuple[list[Proc], Proc]:
    """``n`` workers that run the duties (one holds them); returns them and the holder."""
    procs = [worker_proc(settings, tmp_path, f"worker-{i}", concurrency=4, app=APP).start()
             for i in range(n)]  # fmt: skip
    for p in procs:
        await p.wait_for_log("worker_started", 60)

    def holder() -> Proc | None:
        held = [p for p in procs if "duties_running" in p.log()]
        return held[0] if len(held) == 1 else None

    return procs, await wait_until(holder, timeout=30, what="a duty holder")


async def _took_over(others: Sequence[Proc], since: float, timeout: float) -> float | None:
    """Seconds from ``since`` until one of ``others`` runs the duties (None: not within
    ``timeout``)."""
    marks = {p.name: len(p.log()) for p in others}
    while time.time() - since < timeout:
        if any("duties_running" in p.log()[marks[p.name] :] for p in others):
            return time.time() - since
        await asyncio.sleep(0.1)
    return None


def _duty_settings(base: Settings, **overrides: Any) -> Settings:
    """Workers that run the duties; a 2 s AMQP heartbeat (a frozen worker's prefetched
    deliveries go back to the queue within 4-6 s)."""
    return _settings(base, run_duties=True, worker_amqp_heartbeat=2, **overrides)


async def _started_during(url: str, ids: Sequence[uuid.UUID], t0: float, t1: float) -> int:
    """Jobs submitted between ``t0`` and ``t1`` that started before ``t1``."""
    conn = await tdb.connect(url, timeout=10)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[]) "
            "AND created_at > to_timestamp($2) AND created_at < to_timestamp($3) "
            "AND EXISTS (SELECT 1 FROM job_attempts a WHERE a.job_id = jobs.id "
            "            AND a.started_at < to_timestamp($3))",
            list(ids), t0, t1,
        ))  # fmt: skip
    finally:
        await conn.close()


async def _frozen_holder(settings: Settings, ledger: Ledger, tmp_path: Path, freeze: float) -> None:
    url = settings.database_url
    limit = bound(settings, frozen=True)
    assert freeze >= max(3 * settings.visibility_timeout, limit + 5), "freeze past the bound"
    await _register(url)
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    feeder = Feeder(url, ledger, tmp_path / "spans.txt", random.Random(seed))
    procs, holder = await _duty_workers(settings, tmp_path)
    others = [p for p in procs if p is not holder]
    try:
        async with sampling(url, [KEYED]) as sampler:
            async with feeding(feeder):
                await asyncio.sleep(4)
                frozen_at = time.time()
                holder.signal(signal.SIGSTOP)
                took = await _took_over(others, frozen_at, freeze)
                await asyncio.sleep(max(0.0, frozen_at + freeze - time.time()))
                resumed_at = time.time()
                holder.signal(signal.SIGCONT)
                await asyncio.sleep(3)
            v = await check(url, feeder.ids, ledger, label="admission-frozen-holder", timeout=90)
        during = await _started_during(url, feeder.ids, frozen_at, resumed_at)
        codes = await asyncio.gather(*(p.stop() for p in procs))
    finally:
        for p in procs:
            p.signal(signal.SIGCONT)
    events, problems = await _final_checks(url, [KEYED])
    admission, start = longest_gaps(events)
    print(f"[admission] frozen duty holder (seed {seed}) for {freeze:.0f} s: taken over after "
          f"{took and round(took, 1)} s (bound {takeover(settings, frozen=True):.0f} s); "
          f"{during} jobs submitted during the freeze started during it; longest wait of a key "
          f"with room: to admission {admission.seconds:.1f} s ({admission.where}), to a start "
          f"{start.seconds:.1f} s ({start.where}); bound {limit:.0f} s; {sampler.samples} "
          f"samples, {len(sampler.over)} over the limit; resumed holder lost the duties: "
          f"{'duties_lost' in holder.log()}")  # fmt: skip
    v.assert_clean()
    assert not sampler.over, sampler.over[:10]
    assert not problems, problems[:10]
    assert took is not None and took <= takeover(settings, frozen=True), took
    assert during > 0, "nothing submitted during the freeze started before it ended"
    assert start.seconds <= limit, (start, limit)
    assert codes == [0, 0, 0], codes


@pytest.mark.timeout(240)
async def test_a_frozen_duty_holder_is_taken_over_and_admission_goes_on(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """A 2 s election turn (``CONVEYOR_OUTBOX_STALE_AFTER=6``): the takeover bound is 6 + 2 +
    4 s, the bound of a key's wait 10 + 12 s, the freeze 30 s (a holder never replaced fails)."""
    settings = _duty_settings(fsettings, outbox_stale_after=6.0)
    await _frozen_holder(settings, ledger, tmp_path, freeze=30.0)


@pytest.mark.soak
@pytest.mark.timeout(600)
async def test_a_frozen_duty_holder_is_taken_over_soak(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """The default election turn (5 s, a frozen holder's session ends after 15 s): the takeover
    bound is 15 + 5 + 4 s, the bound of a key's wait 10 + 24 s, the freeze 60 s."""
    await _frozen_holder(_duty_settings(fsettings), ledger, tmp_path, freeze=60.0)


@pytest.mark.timeout(180)
async def test_a_killed_duty_holder_is_replaced_and_admission_goes_on(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """SIGKILL the holder (not restarted): a standby takes the duties at its next turn, and no
    key with room waits past two leases plus that takeover."""
    settings = _duty_settings(fsettings, outbox_stale_after=6.0)
    url = settings.database_url
    limit = bound(settings, frozen=False)
    await _register(url)
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    feeder = Feeder(url, ledger, tmp_path / "spans.txt", random.Random(seed))
    procs, holder = await _duty_workers(settings, tmp_path)
    others = [p for p in procs if p is not holder]
    async with sampling(url, [KEYED]) as sampler:
        async with feeding(feeder):
            await asyncio.sleep(4)
            killed_at = time.time()
            await holder.kill()
            took = await _took_over(others, killed_at, 30)
            await asyncio.sleep(8)
        v = await check(url, feeder.ids, ledger, label="admission-killed-holder", timeout=90)
    codes = await asyncio.gather(*(p.stop() for p in others))
    events, problems = await _final_checks(url, [KEYED])
    admission, start = longest_gaps(events)
    print(f"[admission] killed duty holder (seed {seed}): taken over after "
          f"{took and round(took, 1)} s (bound {takeover(settings, frozen=False):.0f} s); longest "
          f"wait of a key with room: to admission {admission.seconds:.1f} s ({admission.where}), "
          f"to a start {start.seconds:.1f} s ({start.where}); bound {limit:.0f} s; "
          f"{sampler.samples} samples, {len(sampler.over)} over the limit")  # fmt: skip
    v.assert_clean()
    assert not sampler.over, sampler.over[:10]
    assert not problems, problems[:10]
    assert took is not None and took <= takeover(settings, frozen=False), took
    assert start.seconds <= limit, (start, limit)
    assert codes == [0, 0], codes


# --------------------------------------------------------------------------- 2b: paused in admit

PAUSE_IN_TX = 2.0  # a pause shorter than the idle-in-transaction bound: the worker commits after
CONTENDED = 2  # such pauses with a higher-priority job for a key the paused worker admitted to
FREEZE_IN_TX = 15.0  # past the idle-in-transaction bound (5 s), so a missing bound shows
SLACK = 3.0  # beyond that bound: the waiters wake, a pass runs, on a loaded machine

# What the paused worker's open transaction admitted (uncommitted: the committed versions of
# those rows carry its transaction id as xmax) and the jobs it completed there.
PAUSED_ROWS = """
SELECT j.partition_key AS key, j.status::text AS status FROM jobs j
JOIN pg_stat_activity a ON j.xmax = a.backend_xid
WHERE a.datname = current_database() AND a.application_name = 'conveyor-worker'
  AND a.state = 'idle in transaction' AND a.state_change < now() - interval '0.1 s'
"""


@dataclass
class Pausing:
    """Three workers, the first under ``pausing_statement`` (it SIGSTOPs itself just after
    ``admit`` in an outcome transaction, once per ``pause``), with the API, relay and duty in the
    test's loop, a feeder and a sampler."""

    proc: Proc
    flag: Path
    feeder: Feeder
    sampler: Sampler
    _seen: int = 0

    def arm(self) -> None:
        self._seen = self.proc.log().count("pausing_statement: frozen admit")
        self.flag.write_text("")  # any call of admit inside a transaction

    async def paused(self, timeout: float = 30.0) -> None:
        await wait_until(
            lambda: self.proc.log().count("pausing_statement: frozen admit") > self._seen,
            timeout=timeout, what="the worker pausing in admit",
        )  # fmt: skip
        await wait_until(lambda: _state(self.proc.pid) == "T", timeout=5, what="SIGSTOP")

    async def pause(self, timeout: float = 30.0) -> None:
        await asyncio.to_thread(self.arm)
        await self.paused(timeout)


@contextlib.asynccontextmanager
async def pausing(settings: Settings, feeder: Feeder, tmp_path: Path) -> Any:
    url = settings.database_url
    await _register(url)
    flag = tmp_path / "pause"
    args = [sys.executable, "-m", "tests.faults.pausing_statement", str(flag), "admit", "--",
            "worker", "--app", APP, "--concurrency", "4"]  # fmt: skip
    paused = Proc("paused-worker", args, component_env(settings), tmp_path).start()
    procs = [paused] + [worker_proc(settings, tmp_path, f"worker-{i}", concurrency=4,
                                    app=APP).start() for i in range(2)]  # fmt: skip
    try:
        for p in procs:
            await p.wait_for_log("worker_started", 60)
        async with running(settings) as _stack, sampling(url, [KEYED]) as sampler:
            async with feeding(feeder):
                await asyncio.sleep(2)
                yield Pausing(paused, flag, feeder, sampler)
                await asyncio.sleep(3)
            v = await check(url, feeder.ids, feeder.ledger, label="admission-paused-in-admit",
                            timeout=90)  # fmt: skip
        codes = await asyncio.gather(*(p.stop() for p in procs))
    finally:
        for p in procs:
            p.signal(signal.SIGCONT)
    v.assert_clean()
    assert not sampler.over, sampler.over[:10]
    assert codes == [0, 0, 0], codes


@pytest.mark.timeout(240)
async def test_a_worker_paused_inside_its_admitting_outcome_makes_the_others_wait(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """A worker pauses (a GC, a VM hiccup: shorter than the session bound) right after ``admit``
    in its outcome transaction: its session holds the type's advisory lock and the jobs it
    admitted, uncommitted. For a key it admitted a job to whose slot every admitter sees free
    (not one its own outcome freed), the test submits a higher-priority job of that key, then
    opens the gate of jobs the other workers hold, so their outcomes run admission passes that
    see that job. They must wait for the paused worker, not see the slot free and admit the
    job too: after it resumes and commits, no key has two jobs admitted (the sampler), nothing
    was claimed twice. ``CONTENDED`` such pauses.

    The duty passes every second (``CONVEYOR_ADMISSION_INTERVAL=1``) instead of 0.05 s: new jobs
    of idle keys wait that long with room, so a worker's pass often admits to such keys."""
    settings = _settings(fsettings, admission_interval=1.0)
    assert settings.db_idle_in_transaction_timeout > PAUSE_IN_TX + 1.5
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    rng = random.Random(seed)
    feeder = Feeder(settings.database_url, ledger, tmp_path / "spans.txt", rng, sleep=(0.1, 0.6))
    contended: list[str] = []  # keys given a higher-priority job while the worker was paused
    pauses = 0
    missed: Counter[str] = Counter()  # why the other tries did not count
    conn = await tdb.connect(settings.database_url, timeout=10)
    try:
        async with pausing(settings, feeder, tmp_path) as w:
            deadline = time.monotonic() + 120
            while len(contended) < CONTENDED and time.monotonic() < deadline:
                pauses += 1
                gate = tmp_path / f"gate-{pauses}"
                for i in range(3):  # held by the other workers (some of them) until the gate
                    payload = _payload(ledger, feeder.span_file, rng, acct=f"g{pauses}-{i}",
                                       gate=str(gate), sleep=0)  # fmt: skip
                    feeder.ids.append(await enqueue(conn, KEYED, payload))

                async def held_elsewhere(gate: Path = gate) -> bool:
                    rows = await conn.fetch(
                        "SELECT worker_id FROM jobs WHERE payload->>'gate' = $1 "
                        "AND status = 'IN_PROGRESS'", str(gate))  # fmt: skip
                    return any(_pid_of(r["worker_id"]) != w.proc.pid for r in rows)

                try:
                    await wait_until(held_elsewhere, timeout=10, what="gated jobs elsewhere")
                except AssertionError:  # all on the worker to pause, or not admitted yet
                    await asyncio.to_thread(gate.touch)
                    missed["gated jobs not elsewhere"] += 1
                    continue
                await asyncio.to_thread(w.arm)
                try:
                    await w.paused(timeout=10)
                except AssertionError:  # its slots held by gated jobs: no outcome to pause in
                    await asyncio.to_thread(gate.touch)
                    await w.paused()
                    w.proc.signal(signal.SIGCONT)
                    missed["no outcome"] += 1
                    continue
                paused_at = time.monotonic()
                await asyncio.sleep(0.15)  # idle in transaction for 0.1 s: the paused one
                rows = await conn.fetch(PAUSED_ROWS)
                own = {r["key"] for r in rows if r["status"] == "IN_PROGRESS"}
                keys = sorted({r["key"] for r in rows if r["status"] == "WAITING"} - own)
                for key in keys:
                    payload = _payload(ledger, feeder.span_file, rng, acct=key)
                    feeder.ids.append(await enqueue(conn, KEYED, payload, priority=9))
                await asyncio.to_thread(gate.touch)  # the others' outcomes: admission passes
                await asyncio.sleep(max(0.0, paused_at + PAUSE_IN_TX - time.monotonic()))
                w.proc.signal(signal.SIGCONT)
                contended += keys[:1]
                missed["its own keys only"] += not keys
                await asyncio.sleep(0.5)
    finally:
        await conn.close()
    _, problems = await _final_checks(settings.database_url, [KEYED])
    print(f"[admission] worker paused in its admitting outcome (seed {seed}): {pauses} tries, "
          f"{len(contended)} with a higher-priority job for a key it admitted to {contended}, "
          f"the others {dict(missed)}; "
          f"{w.sampler.samples} samples, {len(w.sampler.over)} over")  # fmt: skip
    assert len(contended) >= CONTENDED, "too few pauses caught an admission others could see"
    assert not problems, problems[:10]


@pytest.mark.timeout(180)
async def test_a_worker_frozen_inside_its_admitting_outcome_is_cut_off_by_the_session_bound(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """The same worker frozen for ``FREEZE_IN_TX``: every other admitter of the type waits for
    its advisory lock until PostgreSQL ends the frozen session after
    ``CONVEYOR_DB_IDLE_IN_TRANSACTION_TIMEOUT`` (its admissions roll back); the type's keys are
    admitted again within that bound (plus ``SLACK``) while it is still frozen, and nothing is
    admitted past a limit or twice."""
    settings = _settings(fsettings)
    idle = settings.db_idle_in_transaction_timeout
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    feeder = Feeder(settings.database_url, ledger, tmp_path / "spans.txt", random.Random(seed),
                    per_tick=2)  # fmt: skip
    async with pausing(settings, feeder, tmp_path) as w:
        await w.pause()
        frozen_at = time.time()
        await asyncio.sleep(FREEZE_IN_TX)
        resumed_at = time.time()
        w.proc.signal(signal.SIGCONT)
    events, problems = await _final_checks(settings.database_url, [KEYED])
    admission, start = longest_gaps(events)
    admitted = [e.at for e in events if e.old == "WAITING" and e.new == "PENDING"]
    during = [frozen_at] + [t for t in admitted if frozen_at < t < resumed_at] + [resumed_at]
    stalled = max(b - a for a, b in itertools.pairwise(during))  # no admission of the type
    late = [t for t in admitted if frozen_at + idle + SLACK < t < resumed_at]
    cut = [line for line in w.proc.log().splitlines() if "idle-in-transaction" in line]
    print(f"[admission] worker frozen in its admitting outcome (seed {seed}) for "
          f"{FREEZE_IN_TX:.0f} s: the type admitted nothing for {stalled:.1f} s at most; longest "
          f"wait of a key with room: to admission {admission.seconds:.1f} s ({admission.where}), "
          f"to a start {start.seconds:.1f} s; bound {idle:.0f} + {SLACK:.0f} s; {len(late)} "
          f"admissions while still frozen past the bound; session ended by the server: "
          f"{bool(cut)}; {w.sampler.samples} samples, {len(w.sampler.over)} over")  # fmt: skip
    assert not problems, problems[:10]
    assert cut, "the frozen session was not ended by the idle-in-transaction bound"
    assert late, "no key was admitted while the worker was still frozen"
    assert stalled <= idle + SLACK, (stalled, idle)
    assert admission.seconds <= idle + SLACK, (admission, idle)


# --------------------------------------------------------------------------- 4. retries


@pytest.mark.timeout(120)
async def test_a_retry_waits_for_admission_and_never_runs_beside_its_key(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """Per key, a job whose first attempt raises (retry after 1 s) then two more of its key.
    The failed job waits WAITING (never RETRYING, no outbox row but a work one, its holding pen
    never declared) while its key's next job runs, and is admitted again only when the key has
    room: no two bodies of a key overlap, nothing is admitted past the limit."""
    settings = _settings(fsettings)
    url = settings.database_url
    await _register(url)
    span_file = tmp_path / "spans.txt"
    rng = random.Random(0)
    keys = [f"k{i}" for i in range(6)]
    worker = worker_proc(settings, tmp_path, "worker", concurrency=4, app=APP).start()
    pen_rows = 0
    conn = await tdb.connect(url, timeout=10)
    try:
        await worker.wait_for_log("worker_started", 60)
        async with running(settings) as stack, sampling(url, [FLAKY]) as sampler:
            stop = asyncio.Event()

            async def watch_outbox() -> None:
                nonlocal pen_rows
                while not stop.is_set():
                    pen_rows += await conn.fetchval(
                        "SELECT count(*) FROM job_outbox WHERE job_type = $1 "
                        "AND destination <> 'work'", FLAKY)  # fmt: skip
                    await asyncio.sleep(0.02)

            watching = asyncio.create_task(watch_outbox())
            first = await stack.submit_batch(FLAKY, [
                _payload(ledger, span_file, rng, acct=k, fail_first=True, sleep=0.3)
                for k in keys])  # fmt: skip
            await asyncio.sleep(0.01)  # the others' ids come after (admission: priority, id)
            await stack.submit_batch(FLAKY, [
                _payload(ledger, span_file, rng, acct=k, sleep=s)
                for s in (1.5, 0.3) for k in keys])  # fmt: skip
            v = await check(url, stack.accepted, ledger, label="admission-retry", timeout=60)
            stop.set()
            await watching
        pen = await queue_ready(settings.amqp_url, topology(settings).pen_queue(1))
        waited = await conn.fetch(
            "SELECT job_id, count(*) FILTER (WHERE new_status = 'WAITING' AND attempts = 1 "
            "AND old_status = 'IN_PROGRESS') AS n FROM fault_audit "
            "WHERE job_id = ANY($1::uuid[]) GROUP BY 1",
            [uuid.UUID(i) for i in first],
        )
        outcomes = await conn.fetch(
            "SELECT job_id, array_agg(outcome ORDER BY attempt) AS o FROM job_attempts "
            "WHERE job_id = ANY($1::uuid[]) GROUP BY 1",
            [uuid.UUID(i) for i in first],
        )
    finally:
        await conn.close()
        await worker.stop()
    _, problems = await _final_checks(url, [FLAKY])
    pairs = overlaps(spans(span_file), {})
    print(f"[admission] retries: outbox rows for a pen seen {pen_rows}; pen queue "
          f"{'never declared' if pen < 0 else f'{pen} ready'}; {len(pairs)} overlapping bodies; "
          f"{sampler.samples} samples, {len(sampler.over)} over the limit; attempts of the "
          f"failing jobs: {sorted(tuple(r['o']) for r in outcomes)}")  # fmt: skip
    v.assert_clean()
    assert pen_rows == 0 and pen == -1, (pen_rows, pen)
    assert not problems, problems[:10]  # no RETRYING, no claim without an admission
    assert {r["job_id"]: r["n"] for r in waited} == {uuid.UUID(i): 1 for i in first}
    assert all(list(r["o"]) == ["retry", "completed"] for r in outcomes), outcomes
    assert not pairs, pairs[:5]
    assert not sampler.over, sampler.over[:10]


# --------------------------------------------------------------------------- 5. a held waiting job

HOLD_OPEN = 12.0  # how long the application's transaction stays open


# The bug both tests below show, in admit() (admission.sql): a pass picks its jobs from its
# snapshot, then takes them with ``UPDATE ... WHERE id = ANY(picked) AND status = 'WAITING'``,
# which waits for a row another transaction holds, under the type's advisory lock, and, once
# that transaction ends, re-checks the status alone.
async def _debounced(
    conn: asyncpg.Connection, job_type: str, payload: dict[str, Any], seconds: float,
    most: float | None = None,
) -> uuid.UUID:  # fmt: skip
    spec = JobSpec(job_type, payload, debounce_seconds=seconds, debounce_max_seconds=most)
    return (await enqueue_many(conn, [spec]))[0]


@pytest.mark.timeout(180)
async def test_an_open_transaction_holding_a_waiting_job_does_not_stall_admission(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """An application folds a debounced submit into its key's waiting job inside its own
    transaction and keeps it open ``HOLD_OPEN`` s (a slow request, a frozen application). The
    other keys of the type must keep being admitted (a key with room waits at most ``SLACK``),
    and so must a job of another limited type (``adm_quiet``, after ``adm_keyed`` in the duty's
    order) submitted meanwhile."""
    settings = _settings(fsettings)
    url = settings.database_url
    await _register(url)
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    rng = random.Random(seed)
    span_file = tmp_path / "spans.txt"
    feeder = Feeder(url, ledger, span_file, rng, per_tick=2)
    procs = [worker_proc(settings, tmp_path, f"worker-{i}", concurrency=4, app=APP).start()
             for i in range(2)]  # fmt: skip
    app = await tdb.connect(url, timeout=10)
    try:
        for p in procs:
            await p.wait_for_log("worker_started", 60)
        async with running(settings) as _stack, sampling(url, [KEYED]) as sampler:
            held = await _debounced(app, KEYED, _payload(ledger, span_file, rng, acct="deb"), 1.0)
            async with feeding(feeder):
                await asyncio.sleep(0.5)
                async with app.transaction():
                    again = _payload(ledger, span_file, rng, acct="deb")
                    assert await _debounced(app, KEYED, again, 1.0) == held  # folded
                    opened_at = time.time()
                    await asyncio.sleep(2)  # its committed run_at is due: a pass picks it
                    quiet = await enqueue(feeder_conn := await tdb.connect(url), QUIET,
                                          _payload(ledger, span_file, rng))  # fmt: skip
                    await feeder_conn.close()
                    await asyncio.sleep(HOLD_OPEN - 2)
                closed_at = time.time()
                await asyncio.sleep(3)
            v = await check(url, [*feeder.ids, held, quiet], ledger, label="admission-held-job",
                            timeout=90)  # fmt: skip
        codes = await asyncio.gather(*(p.stop() for p in procs))
    finally:
        await app.close()
    events, problems = await _final_checks(url, [KEYED, QUIET])
    admission, start = longest_gaps(e for e in events if e.key != "deb" and e.job_type == KEYED)
    admitted = [e.at for e in events if e.old == "WAITING" and e.new == "PENDING"]
    stalled = max(b - a for a, b in itertools.pairwise(admitted) if opened_at < b and a < closed_at)
    blocked = sum(p.log().count("outcome_write_isolated") for p in procs)  # their outcomes too
    trail = [e for e in events if e.job_id == quiet]
    waited = next(e.at for e in trail if e.new == "PENDING") - trail[0].at
    print(f"[admission] an open transaction held key 'deb''s waiting job for {HOLD_OPEN:.0f} s: "
          f"the other keys' longest wait with room: to admission {admission.seconds:.1f} s "
          f"({admission.where}), to a start {start.seconds:.1f} s; no admission of any type for "
          f"{stalled:.1f} s; the {QUIET} job waited {waited:.1f} s for admission; outcomes "
          f"set aside after a lock timeout {blocked} (jobs run again: "
          f"{v.duplicates_executed}); {sampler.samples} samples, "
          f"{len(sampler.over)} over")  # fmt: skip
    v.assert_clean()
    assert not sampler.over, sampler.over[:10]
    assert not problems, problems[:10]
    assert codes == [0, 0], codes
    assert waited <= SLACK, waited
    assert admission.seconds <= SLACK, admission


@pytest.mark.timeout(120)
async def test_a_job_folded_in_an_open_transaction_waits_for_its_new_run_at(
    fsettings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    """A debounced job (1 s) is folded into by a submit with a 60 s debounce inside a
    transaction that stays open 3 s: its run_at moves 60 s ahead when it commits, so it must
    still be WAITING afterwards. The admission duty runs (in the test's loop); no worker."""
    settings = _settings(fsettings)
    url = settings.database_url
    await _register(url)
    rng = random.Random(0)
    span_file = tmp_path / "spans.txt"
    app = await tdb.connect(url, timeout=10)
    try:
        async with running(settings):
            payload = _payload(ledger, span_file, rng, acct="deb")
            job = await _debounced(app, KEYED, payload, 1.0, most=600.0)
            async with app.transaction():
                assert await _debounced(app, KEYED, payload, 60.0) == job  # folded
                await asyncio.sleep(3)  # the committed run_at (1 s) is due: a pass picks the job
            await asyncio.sleep(2)
            row = await app.fetchrow(
                "SELECT status::text AS status, round(extract(epoch FROM run_at - now())) AS ahead "
                "FROM jobs WHERE id = $1", job)  # fmt: skip
    finally:
        await app.close()
    print(f"[admission] a job folded into (debounce 60 s) in a transaction open 3 s: "
          f"{row['status']}, its run_at {row['ahead']} s ahead")  # fmt: skip
    assert row["status"] == "WAITING", dict(row)
