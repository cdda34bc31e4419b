"""``conveyor dlq redrive`` against real services: a dead
letter redrives only the failure it recorded — the job's id at the attempt that failed."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

from conveyor import Job, JobRouter, cli
from conveyor.broker.inspect import Inspector
from conveyor.broker.topology import Topology
from conveyor.core.config import Settings

from ..faults.harness import component_env, publish_raw
from ..stack import Stack, running_stack, wait_for
from .broker_state import published, wait_metric

router = JobRouter()


@router.job("doomed", max_retries=0)
async def doomed(job: Job) -> None:
    raise ValueError(f"doomed at attempt {job.attempt}")


async def _dlq(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> dict[str, int]:
    """``conveyor dlq redrive --all`` (in a thread: the command runs its own event loop)."""
    for name, value in component_env(settings).items():
        if name.startswith("CONVEYOR_"):
            monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, ["dlq", "redrive", "--all"]) == 0
    return dict(orjson.loads(capsys.readouterr().out))


async def _status(stack: Stack, job_id: str) -> dict[str, object]:
    r = await stack.client.get(f"/jobs/{job_id}")
    assert r.status_code == 200
    return dict(r.json())


async def _stop_workers(stack: Stack) -> None:
    for w in stack.workers:
        await w.stop(grace=1)
    stack.workers.clear()


async def test_redrive_all_does_not_revive_a_job_redriven_then_cancelled(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_stack(settings, router) as stack:
        cancelled, failed = await stack.submit("doomed"), await stack.submit("doomed")
        await wait_for(settings.database_url, [cancelled, failed], statuses=["FAILED"])
        await wait_metric(lambda: published(stack.relay, "dead") >= 2, what="two dead letters")
        await _stop_workers(stack)
        assert (await stack.client.post(f"/jobs/{cancelled}/retry")).status_code == 200
        assert (await stack.client.post(f"/jobs/{cancelled}/cancel")).status_code == 200
        assert (await _status(stack, cancelled))["status"] == "CANCELLED"
        summary = await _dlq(settings, monkeypatch, capsys)
        assert (await _status(stack, cancelled))["status"] == "CANCELLED"
        assert (await _status(stack, failed))["status"] == "PENDING"
    assert summary == {"scanned": 2, "drop": 1, "redrive": 1}


async def test_a_dead_letter_redrives_only_the_attempt_it_recorded(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Failed at attempt 1, redriven through the API, failed again at attempt 2: two letters,
    one redrive; the letter of attempt 1 is stale."""
    async with running_stack(settings, router) as stack:
        job_id = await stack.submit("doomed")
        await wait_for(settings.database_url, [job_id], statuses=["FAILED"])
        await wait_metric(lambda: published(stack.relay, "dead") >= 1, what="a dead letter")
        assert (await stack.client.post(f"/jobs/{job_id}/retry")).status_code == 200
        await wait_metric(lambda: published(stack.relay, "dead") >= 2, what="a second one")
        await _stop_workers(stack)
        inspector = Inspector(settings.amqp_url, Topology(settings.namespace), name="test")
        try:
            async with inspector.dead_letters() as batch:
                letters = [
                    (m.message.job_id, m.message.attempt) for m in batch.letters if m.message
                ]
        finally:
            await inspector.close()
        assert sorted(letters) == [(uuid.UUID(job_id), 1), (uuid.UUID(job_id), 2)]
        summary = await _dlq(settings, monkeypatch, capsys)
        body = await _status(stack, job_id)
    assert summary == {"scanned": 2, "drop": 1, "redrive": 1}
    assert body["status"] == "PENDING" and body["attempts"] == 2


async def test_a_letter_from_before_the_attempt_field_still_redrives_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A letter without the attempt field (published by hand or by another tool) is fenced by
    the attempts read during the scan."""
    async with running_stack(settings, router) as stack:
        job_id = await stack.submit("doomed")
        await wait_for(settings.database_url, [job_id], statuses=["FAILED"])
        await wait_metric(lambda: published(stack.relay, "dead") >= 1, what="a dead letter")
        await _stop_workers(stack)
        inspector = Inspector(settings.amqp_url, Topology(settings.namespace), name="test")
        try:
            async with inspector.dead_letters() as batch:  # replace it by one without attempt
                await batch.letters[0].settle()
        finally:
            await inspector.close()
        old = orjson.dumps({"id": job_id, "type": "doomed", "error": "doomed at attempt 1"})
        await publish_raw(settings.amqp_url, f"{settings.namespace}.dead_letter", "", [old])
        summary = await _dlq(settings, monkeypatch, capsys)
        body = await _status(stack, job_id)
        again = await _dlq(settings, monkeypatch, capsys)
    assert summary == {"scanned": 1, "redrive": 1} and body["status"] == "PENDING"
    assert again == {"scanned": 0}


# ``conveyor dlq redrive`` takes one statement for all letters, not one transaction (and one
# NOTIFY inside it) per letter (five statements for five letters).


async def test_redrive_takes_one_statement_for_every_letter_and_fences_each(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conveyor.store import for_schema

    store_type = type(for_schema(settings.db_schema))
    original = store_type.job_redrive_failed
    calls: list[int] = []

    async def counting(self: object, conn: object, letters: list[object]) -> list[uuid.UUID]:
        calls.append(len(letters))
        return await original(self, conn, letters)  # type: ignore[arg-type]

    monkeypatch.setattr(store_type, "job_redrive_failed", counting)
    async with running_stack(settings, router) as stack:
        ids = [await stack.submit("doomed") for _ in range(5)]
        await wait_for(settings.database_url, ids, statuses=["FAILED"])
        await wait_metric(lambda: published(stack.relay, "dead") >= 5, what="five dead letters")
        await _stop_workers(stack)
        # the relay published one dead letter twice (a crash between confirm and delete)
        twin = orjson.dumps({"id": ids[0], "type": "doomed", "attempt": 1, "error": "doomed"})
        await publish_raw(settings.amqp_url, f"{settings.namespace}.dead_letter", "", [twin])
        summary = await _dlq(settings, monkeypatch, capsys)
        statuses = {(await _status(stack, i))["status"] for i in ids}
    assert calls == [6]
    assert summary == {"scanned": 6, "redrive": 5, "drop": 1}
    assert statuses == {"PENDING"}
