"""The handlers the benchmark's worker runs: ``conveyor worker --app bench.app:router``."""

from __future__ import annotations

from conveyor import Job, JobRouter

router = JobRouter()


@router.job("noop")
async def noop(job: Job) -> None:
    """Does nothing: the benchmark measures Conveyor's own overhead per job."""
    return None
