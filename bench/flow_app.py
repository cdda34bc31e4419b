"""The handlers of the admission benchmark (``bench/flow.py``): ``conveyor worker --app
bench.flow_app:router``. Every one sleeps for the payload's ``s`` seconds (none: no sleep); a job
with ``"fail": true`` raises on its first attempt (retried after 1 s). The types differ only in
their limits, so a comparison of two of them measures admission and nothing else."""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor import Job, JobRouter

router = JobRouter()


async def _run(job: Job) -> None:
    seconds = job.payload.get("s")
    if seconds:
        await asyncio.sleep(float(seconds))
    if job.payload.get("fail") and job.attempt == 1:
        raise RuntimeError("the first attempt fails (bench.flow_app)")


def _type(name: str, **limits: Any) -> None:
    router.job(name, retry_delays=[1], **limits)(_run)


_type("noop")  # the plain batch workload of bench.workloads (scenario others)
_type("flow_plain")  # no limit: the baseline of throughput (a) and of hot_cold
_type("flow_solo")  # no limit, consumed by one worker only: 16 slots, throughput (b)'s baseline
_type("flow_p4", partition_by="k", partition_concurrency=4)  # throughput (a)
_type("flow_p16", partition_by="k", partition_concurrency=16)  # throughput (b)
_type("flow_c4", concurrency=4)  # throughput (c): limited as a whole
_type("flow_hot", partition_by="k")  # hot_cold
_type("flow_fair", partition_by="k")  # fair
_type("flow_rate", partition_by="k", partition_rate_limit="5/s")  # rate
_type("flow_backlog", partition_by="k", partition_concurrency=1)  # others: waits beside
_type("flow_ordered", partition_by="k", ordered=True)  # ordered
_type("flow_hourly", partition_by="k", partition_rate_limit="1/h")  # bench.flow_pass only

# what workers other than the first consume (flow_solo's 16 slots are the first worker's)
SHARED = [t for t in router.handlers if t != "flow_solo"]
