"""Handlers for the admission fault tests (``test_admission_faults.py``), importable by a worker
subprocess as ``tests.faults.admission_app:router``.

Each attempt writes the checker's ledger lines (``apps.record``: ``start`` and ``done``/``fail``)
and its *span* to the file ``payload["spans"]``, so a test can tell whether two handler bodies of
one key overlapped in time: a ``begin`` line when the body starts and an ``end`` line when it
stops (finished, raised, or cancelled), each ``what job attempt pid key time`` (``time.time()``;
``end`` adds how it ended). A body killed with its process has no ``end``.

Payload: ``acct`` (the partition key of the keyed types), ``sleep`` (seconds per attempt),
``gate`` (a file: the attempt waits for it to exist before its sleep), ``fail_first``
(``adm_flaky``), ``ledger``, ``spans``."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from conveyor import Job, JobRouter

from .apps import record

router = JobRouter()


def _span(job: Job, what: str, *rest: object) -> None:
    path = job.payload.get("spans")
    if not path:
        return
    key = job.payload.get("acct", "-")
    fields = [what, job.id, job.attempt, os.getpid(), key, f"{time.time():.6f}", *rest]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (" ".join(map(str, fields)) + "\n").encode())
    finally:
        os.close(fd)


def _exists(path: str) -> bool:
    """A stat: not worth a thread."""
    return os.path.exists(path)


async def _body(job: Job, *, fail_first: bool = False) -> dict[str, Any]:
    record(job, "start")
    _span(job, "begin")
    how = "cancelled"
    gate = job.payload.get("gate")
    try:
        while gate and not _exists(gate):
            await asyncio.sleep(0.02)
        await asyncio.sleep(float(job.payload.get("sleep", 0.05)))
        if fail_first and job.attempt == 1:
            how = "raised"
            record(job, "fail")
            raise ConnectionError("adm_flaky: the first attempt fails on purpose")
        how = "done"
    finally:
        _span(job, "end", how)
    record(job, "done")
    return {"attempt": job.attempt}


@router.job("adm_keyed", partition_by="acct", partition_concurrency=1, max_retries=25)
async def keyed(job: Job) -> dict[str, Any]:
    """One job of an account at a time; many retries (kills and freezes must not exhaust them)."""
    return await _body(job)


@router.job("adm_capped", concurrency=3, max_retries=25)
async def capped(job: Job) -> dict[str, Any]:
    """At most three jobs of the type at once, fleet-wide (a type limited as a whole)."""
    return await _body(job)


@router.job("adm_quiet", concurrency=2)
async def quiet(job: Job) -> dict[str, Any]:
    """A type limited as a whole whose jobs come seldom: no outcome of its own admits them."""
    return await _body(job)


@router.job("adm_flaky", partition_by="acct", partition_concurrency=1, max_retries=3,
            retry_delays=[1])  # fmt: skip
async def flaky(job: Job) -> dict[str, Any]:
    """With ``fail_first`` in its payload, fails its first attempt (retried after 1 s)."""
    return await _body(job, fail_first=bool(job.payload.get("fail_first")))
