"""The example app that `make dev` runs: `conveyor dev --app examples.app:router`."""

from __future__ import annotations

import asyncio
import random
import time

from conveyor import Job, JobRouter, Retry

router = JobRouter()


@router.job("hello", timeout=10)
async def hello(job: Job) -> dict[str, str]:
    """Greets; the result is stored on the job."""
    name = job.payload.get("name", "world")
    return {"greeting": f"Hello, {name}!"}


@router.job("send_email", max_retries=5, retry_delays=[1, 5, 30], timeout=30)
async def send_email(job: Job) -> dict[str, object]:
    """Pretends to send an email; fails now and then to show retries."""
    await asyncio.sleep(0.05)
    if job.payload.get("flaky") and random.random() < 0.5:
        raise ConnectionError("SMTP server did not answer")
    return {"sent_to": job.payload.get("to"), "attempt": job.attempt}


@router.job("resize_image", timeout=60)
def resize_image(job: Job) -> dict[str, object]:
    """A synchronous handler: runs in the worker's thread pool."""
    time.sleep(0.1)
    return {"width": job.payload.get("width", 100) // 2}


@router.job("never_succeeds", max_retries=1, retry_delays=[1])
async def never_succeeds(job: Job) -> None:
    """Fails every attempt: one retry, then FAILED, so the dashboard's dead-letter page (and
    `conveyor dlq list`) has something to show on purpose."""
    raise RuntimeError(f"card declined for order {job.payload.get('order', '?')}")


@router.job("poll_upstream", max_retries=3)
async def poll_upstream(job: Job) -> None:
    """Asks to be tried again later without using up a retry."""
    if job.attempt < 3:
        raise Retry(delay=1, reason="upstream not ready")


@router.job("sync_account", partition_by="account", partition_concurrency=1)
async def sync_account(job: Job) -> dict[str, object]:
    """Per-key limits: one job of an account at a time (its key: the payload's `account`, or
    the submit's `partition_key`), the accounts in turn; `conveyor types partitions
    sync_account` lists them (docs/admission.md)."""
    await asyncio.sleep(0.2)
    return {"account": job.payload.get("account"), "synced": True}
