"""Workflows: jobs that wait for other jobs, submitted in the caller's transaction (all or none).

A job with unfinished dependencies is WAITING: no outbox row, no message. The transaction that
completes its last dependency releases it (PENDING, or SCHEDULED for a future ``run_at``) with
its outbox row: PostgreSQL triggers do that on every path that changes a job's status.
``on_failure="cancel"`` cancels every job downstream of a failed or cancelled
one; ``"continue"`` releases them anyway. See docs/workflows.md::

    wf = Workflow("nightly-report")
    fetch = wf.add("fetch", "fetch_data", {"day": "2026-11-25"})
    parts = [wf.add(f"part-{i}", "transform", {"i": i}, after=[fetch]) for i in range(3)]
    wf.add("report", "build_report", {}, after=parts, priority="high")
    async with conn.transaction():
        workflow_id = await enqueue_workflow(conn, wf)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Unpack

from .core import tracing
from .core.errors import InvalidJob
from .core.jobs import JobOptions, new_job_id
from .jobs.spec import DEFAULT_MAX_PAYLOAD, JobSpec, build_job
from .jobs.types import check_for_enqueue
from .store import NewJob
from .store.caller import asyncpg_connection, schema_store
from .store.schema import ON_FAILURE
from .store.workflows import PARKED, WorkflowJob, WorkflowRow

MAX_JOBS_ENV = "CONVEYOR_MAX_WORKFLOW_JOBS"
DEFAULT_MAX_JOBS = 10_000
# the edges (one per dependency) bound what a submit writes and what a cascade walks: twice a
# largest fan-out-and-fan-in (20,000 edges for 10,000 jobs) with room to spare
MAX_EDGES_ENV = "CONVEYOR_MAX_WORKFLOW_EDGES"
DEFAULT_MAX_EDGES = 100_000
MAX_KEY_LENGTH = 200


@dataclass(frozen=True)
class Node:
    key: str
    spec: JobSpec
    after: tuple[str, ...]


def _key(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_KEY_LENGTH:
        raise InvalidJob(f"a workflow key must be a string of 1 to {MAX_KEY_LENGTH} characters")
    return value


class Workflow:
    """A DAG of jobs, each under a key unique in the workflow. ``on_failure``: ``"cancel"``
    (default: a failed or cancelled job cancels everything downstream of it) or
    ``"continue"`` (its dependents are released anyway)."""

    def __init__(self, name: str, *, on_failure: str = "cancel") -> None:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_KEY_LENGTH:
            raise InvalidJob(f"a workflow name must be 1 to {MAX_KEY_LENGTH} characters")
        if on_failure not in ON_FAILURE:
            raise InvalidJob(f"on_failure must be one of {', '.join(ON_FAILURE)}")
        self.name = name
        self.on_failure = on_failure
        self.nodes: dict[str, Node] = {}

    def add(
        self,
        key: str,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        after: str | Iterable[str] = (),
        **options: Unpack[JobOptions],
    ) -> str:
        """Add a job under ``key``, to run once every job of ``after`` (keys, added before or
        after this one) has completed; the options are ``enqueue()``'s. Returns ``key``."""
        spec = JobSpec(job_type, payload, **options)
        return self._put(_key(key), spec, after)

    def _put(self, key: str, spec: JobSpec, after: str | Iterable[str]) -> str:
        if key in self.nodes:
            raise InvalidJob(f"workflow {self.name!r} already has a job with key {key!r}")
        deps = (after,) if isinstance(after, str) else tuple(after)
        for k in deps:
            _key(k)
        if len(set(deps)) != len(deps):
            raise InvalidJob(f"workflow job {key!r} names a dependency twice")
        self.nodes[key] = Node(key, spec, deps)
        return key

    @property
    def sources(self) -> list[str]:
        """The keys of jobs that wait for nothing."""
        return [k for k, n in self.nodes.items() if not n.after]

    @property
    def sinks(self) -> list[str]:
        """The keys of jobs nothing waits for."""
        needed = {d for n in self.nodes.values() for d in n.after}
        return [k for k in self.nodes if k not in needed]

    def order(self) -> list[str]:
        """The keys, each after its dependencies. Raises ``InvalidJob`` for an unknown
        dependency, a cycle, more jobs than ``CONVEYOR_MAX_WORKFLOW_JOBS`` or more dependencies
        than ``CONVEYOR_MAX_WORKFLOW_EDGES``."""
        limit = int(os.environ.get(MAX_JOBS_ENV, DEFAULT_MAX_JOBS))
        if not self.nodes:
            raise InvalidJob(f"workflow {self.name!r} has no jobs")
        if len(self.nodes) > limit:
            raise InvalidJob(
                f"workflow {self.name!r} has {len(self.nodes)} jobs; the limit is {limit} "
                f"({MAX_JOBS_ENV})"
            )
        edges = sum(len(n.after) for n in self.nodes.values())
        edge_limit = int(os.environ.get(MAX_EDGES_ENV, DEFAULT_MAX_EDGES))
        if edges > edge_limit:
            raise InvalidJob(
                f"workflow {self.name!r} has {edges} dependencies; the limit is {edge_limit} "
                f"({MAX_EDGES_ENV})"
            )
        for node in self.nodes.values():
            for dep in node.after:
                if dep not in self.nodes:
                    raise InvalidJob(
                        f"workflow job {node.key!r} waits for {dep!r}, which is not in the "
                        f"workflow {self.name!r}"
                    )
        out = [k for level in levels({k: n.after for k, n in self.nodes.items()}) for k in level]
        if len(out) < len(self.nodes):
            stuck = sorted(set(self.nodes) - set(out))
            raise InvalidJob(
                f"workflow {self.name!r} has a cycle among {', '.join(map(repr, stuck[:10]))}"
            )
        return out

    def build(
        self, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
    ) -> tuple[list[tuple[str, NewJob]], list[tuple[uuid.UUID, uuid.UUID]]]:
        """Validate the whole workflow as ``enqueue()`` validates a job (the API passes its
        ``CONVEYOR_MAX_PAYLOAD_BYTES``, as for a plain job), before anything is written: the
        rows by key (dependencies first) and the edges (job id, dependency id)."""
        rows: list[tuple[str, NewJob]] = []
        ids: dict[str, uuid.UUID] = {}
        for key in self.order():
            try:
                row = build_job(self.nodes[key].spec, max_payload_bytes=max_payload_bytes)
            except InvalidJob as exc:
                raise type(exc)(f"workflow job {key!r}: {exc}") from None
            rows.append((key, row))
            ids[key] = row.id
        edges = [(ids[n.key], ids[d]) for n in self.nodes.values() for d in n.after]
        return rows, edges


def levels(after: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """The keys of a graph (each key: the keys it waits for, all of them keys of the graph)
    level by level, each level sorted: a key comes after every key it waits for. A key on a
    cycle, or downstream of one, is in no level."""
    waiting = {k: len(deps) for k, deps in after.items()}
    dependents: dict[str, list[str]] = {}
    for key, deps in after.items():
        for dep in deps:
            dependents.setdefault(dep, []).append(key)
    level = sorted(k for k, n in waiting.items() if n == 0)
    out = []
    while level:
        out.append(level)
        for key in level:
            for child in dependents.get(key, ()):
                waiting[child] -= 1
        # a set: a job whose last dependencies are on this level is reached once from each
        level = sorted({c for k in level for c in dependents.get(k, ()) if waiting[c] == 0})
    return out


def _include(wf: Workflow, step: Any, after: Sequence[str]) -> list[str]:
    """Add ``step`` to ``wf`` after ``after``; returns the step's sinks. A tuple step's key is
    its type (``type-2``, ``type-3``... for repeats); a workflow step keeps its keys."""
    if isinstance(step, Workflow):
        sources = set(step.sources)
        for node in step.nodes.values():
            deps = (*node.after, *after) if node.key in sources else node.after
            wf._put(node.key, node.spec, deps)
        return step.sinks
    if not isinstance(step, tuple) or not 2 <= len(step) <= 3:
        raise InvalidJob("a step is (type, payload), (type, payload, options) or a Workflow")
    job_type, payload, *rest = step
    options = dict(rest[0]) if rest else {}
    key, n = str(job_type), 1
    while key in wf.nodes:
        n += 1
        key = f"{job_type}-{n}"
    return [wf.add(key, job_type, payload, after=after, **options)]


# A step of chain/group/chord: (type, payload), (type, payload, options) or a Workflow.


def chain(*steps: Any, name: str = "chain", on_failure: str = "cancel") -> Workflow:
    """Each step waits for the previous one."""
    wf = Workflow(name, on_failure=on_failure)
    last: list[str] = []
    for step in steps:
        last = _include(wf, step, last)
    return wf


def group(*steps: Any, name: str = "group", on_failure: str = "cancel") -> Workflow:
    """Steps side by side, none waiting for another."""
    wf = Workflow(name, on_failure=on_failure)
    for step in steps:
        _include(wf, step, ())
    return wf


def chord(header: Any, body: Any, *, name: str = "chord", on_failure: str = "cancel") -> Workflow:
    """``body`` waits for every job of ``header`` (a group, or a sequence of steps)."""
    if not isinstance(header, Workflow):
        header = group(*header)
    return chain(header, body, name=name, on_failure=on_failure)


async def enqueue_workflow(
    conn: Any,
    workflow: Workflow,
    *,
    notify: bool = True,
    schema: str | None = None,
    built: tuple[list[tuple[str, NewJob]], list[tuple[uuid.UUID, uuid.UUID]]] | None = None,
) -> uuid.UUID:
    """Submit ``workflow`` on ``conn`` (asyncpg, SQLAlchemy AsyncSession/AsyncConnection),
    joining its transaction (in one of its own when ``conn`` is an asyncpg connection outside
    any). Returns the workflow's id. A workflow job whose idempotency or unique key names an
    existing job is refused (``InvalidJob``, after the insert: the caller's transaction must
    roll back, as ``async with conn.transaction()`` does). ``built``: ``workflow.build()``
    already checked by the caller against its own policy (the API's job types and limits)."""
    rows, edges = built or workflow.build()
    raw = await asyncpg_connection(conn)
    if callable(getattr(raw, "is_in_transaction", None)) and not raw.is_in_transaction():
        async with raw.transaction():
            return await _submit(raw, workflow, rows, edges, notify, schema, built is None)
    return await _submit(raw, workflow, rows, edges, notify, schema, built is None)


async def _submit(
    raw: Any,
    workflow: Workflow,
    rows: list[tuple[str, NewJob]],
    edges: list[tuple[uuid.UUID, uuid.UUID]],
    notify: bool,
    schema: str | None,
    check_types: bool,
) -> uuid.UUID:
    store = schema_store(schema)
    jobs = [row for _, row in rows]
    if check_types:
        await check_for_enqueue(raw, store, {r.job_type for r in jobs})
    counts: dict[uuid.UUID, int] = {}
    for child, _ in edges:
        counts[child] = counts.get(child, 0) + 1
    workflow_id = new_job_id()
    name, policy = workflow.name, workflow.on_failure
    pending = 0
    with tracing.submitting(None) as trace_context:
        if any(r.unique_key is not None for r in jobs):
            # a unique key's claim (and the takeover of a vanished holder's) is the usual
            # submit's; the workflow is attached to the rows it wrote
            # a job with dependencies goes in parked (no outbox row) until the attach
            parked = [
                replace(r, run_at=PARKED, delay_seconds=None) if r.id in counts else r for r in jobs
            ]
            result = await store.job_insert_checked(raw, parked, trace_context)
            inserted: set[uuid.UUID] = set(result.inserted)
            keyed = [(row, key, counts.get(row.id, 0)) for key, row in rows]
            if inserted.issuperset(r.id for r in jobs):
                pending = await store.workflow_attach(raw, workflow_id, name, policy, keyed, edges)
        else:
            keyed_rows = [(row, key, counts.get(row.id, 0)) for key, row in rows]
            inserted, pending = await store.workflow_insert(
                raw, workflow_id, name, policy, keyed_rows, edges, trace_context
            )
    for key, row in rows:
        if row.id not in inserted:
            raise InvalidJob(
                f"workflow job {key!r}: its idempotency key or unique key names an existing "
                "job; a workflow's jobs are new jobs"
            )
    if notify and pending:
        await store.outbox_notify(raw)
    return workflow_id


async def cancel_workflow(conn: Any, workflow_id: uuid.UUID, *, schema: str | None = None) -> int:
    """Cancel every unfinished job of the workflow (a running one is asked to stop, and its
    result is discarded); nothing is released after it. Returns how many jobs it cancelled or
    asked to stop. Raises ``LookupError`` for no such workflow."""
    n = await schema_store(schema).workflow_cancel(await asyncpg_connection(conn), workflow_id)
    if n is None:
        raise LookupError(f"no workflow {workflow_id}")
    return n


async def get_workflow(
    conn: Any, workflow_id: uuid.UUID, *, schema: str | None = None
) -> tuple[WorkflowRow, list[WorkflowJob]] | None:
    """The workflow with its counts by status, and its jobs; None for no such workflow."""
    store, raw = schema_store(schema), await asyncpg_connection(conn)
    row = await store.workflow_get(raw, workflow_id)
    return None if row is None else (row, await store.workflow_jobs(raw, workflow_id))
