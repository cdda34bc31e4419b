"""Tracing: one trace from the submit request through the commit, the publish and
each attempt of the job, with an in-memory exporter, over the real API, relay, broker and
worker. With tracing off, an incoming ``traceparent`` is still stored (a tracing worker joins
it) and a malformed one is ignored."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from conveyor.core import tracing
from conveyor.core.config import Settings

from .. import apps
from .. import db as tdb
from ..stack import running_stack, wait_for


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    provider = TracerProvider()
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    try:
        yield spans
    finally:
        tracing.uninstall()
        provider.shutdown()


def _incoming() -> tuple[int, int, str]:
    trace_id, span_id = secrets.randbits(128) | 1, secrets.randbits(64) | 1
    return trace_id, span_id, f"00-{trace_id:032x}-{span_id:016x}-01"


def _header(span: ReadableSpan) -> str:
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def _named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _parent(span: ReadableSpan) -> int:
    assert span.parent is not None, span.name
    return span.parent.span_id


async def _stored(db_url: str, job_id: str) -> Any:
    conn = await tdb.connect(db_url)
    try:
        return await conn.fetchval(
            "SELECT trace_context FROM jobs WHERE id = $1", uuid.UUID(job_id)
        )
    finally:
        await conn.close()


async def test_one_trace_from_the_request_to_each_attempt(
    settings: Settings, db_url: str, exporter: InMemorySpanExporter
) -> None:
    apps.reset()
    trace_id, caller_span, header = _incoming()
    async with running_stack(settings, apps.router, concurrency=4) as stack:
        r = await stack.client.post(
            "/jobs",
            json={"type": "flaky", "payload": {"succeed_on": 2}},
            headers={"traceparent": header},
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        # a batch without a traceparent: its server span starts a trace its jobs share
        r = await stack.client.post("/jobs/batch", json={"jobs": [{"type": "noop"}] * 2})
        assert r.status_code == 201, r.text
        batch = [j["id"] for j in r.json()["jobs"]]
        assert await wait_for(db_url, [job_id], timeout=30) == {uuid.UUID(job_id): "COMPLETED"}
        await wait_for(db_url, batch, timeout=30)
        stored = await _stored(db_url, job_id)
        batch_stored = {await _stored(db_url, i) for i in batch}

    spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
    (server,) = _named(spans, "POST /jobs")
    (submit,) = _named(spans, "conveyor.submit")
    publishes = _named(spans, "conveyor.publish")
    attempts = sorted(_named(spans, "conveyor.attempt"),
                      key=lambda s: s.attributes["conveyor.job.attempt"])  # fmt: skip

    # request → commit: the API's server span continues the caller's trace
    assert server.kind is SpanKind.SERVER and _parent(server) == caller_span
    assert submit.kind is SpanKind.PRODUCER and _parent(submit) == server.context.span_id
    assert submit.attributes["conveyor.job.id"] == job_id
    assert stored == _header(submit) == f"00-{trace_id:032x}-{submit.context.span_id:016x}-01"
    # commit → publish: the first message and the retry's, each a child of the commit
    assert [p.attributes["conveyor.destination"] for p in publishes] == ["work", "retry"]
    assert {_parent(p) for p in publishes} == {submit.context.span_id}
    # publish → attempt: each attempt is a child of the message that delivered it
    assert [a.attributes["conveyor.job.attempt"] for a in attempts] == [1, 2]
    assert [_parent(a) for a in attempts] == [p.context.span_id for p in publishes]
    assert [a.attributes["conveyor.outcome"] for a in attempts] == ["retry", "completed"]
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert "boom on attempt 1" in (attempts[0].status.description or "")
    assert attempts[1].status.status_code is StatusCode.UNSET
    assert all(a.attributes["conveyor.job.id"] == job_id for a in attempts)
    (batch_submit,) = [
        s for s in _named(list(exporter.get_finished_spans()), "conveyor.submit")
        if s.attributes.get("conveyor.job.count") == 2
    ]  # fmt: skip
    assert batch_stored == {_header(batch_submit)}
    batch_attempts = [
        s for s in _named(list(exporter.get_finished_spans()), "conveyor.attempt")
        if s.attributes["conveyor.job.id"] in batch
    ]  # fmt: skip
    assert len(batch_attempts) == 2
    assert {s.context.trace_id for s in batch_attempts} == {batch_submit.context.trace_id}
    assert batch_submit.context.trace_id != trace_id
    # nothing of this job landed in another trace
    others = [s for s in exporter.get_finished_spans() if s.context.trace_id != trace_id]
    assert not [s for s in others if s.attributes.get("conveyor.job.id") == job_id]


VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# malformed or invalid: ignored, never stored
INVALID = [
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    VALID.upper(),
    VALID + "; drop table jobs",
    "ff" + VALID[2:],
    "x" * 300,
    "",
]


async def test_tracing_off_stores_a_valid_incoming_traceparent_only(
    settings: Settings, db_url: str
) -> None:
    assert not tracing.enabled()
    async with running_stack(settings, None, maintenance=False, relays=0) as stack:
        stored = {}
        for header in [VALID, *INVALID]:
            r = await stack.client.post(
                "/jobs", json={"type": "noop"}, headers={"traceparent": header}
            )
            assert r.status_code == 201, r.text
            stored[header] = await _stored(db_url, r.json()["id"])
        r = await stack.client.post(
            "/jobs/batch", json={"jobs": [{"type": "noop"}] * 2}, headers={"traceparent": VALID}
        )
        assert r.status_code == 201, r.text
        batch = {await _stored(db_url, j["id"]) for j in r.json()["jobs"]}
    assert stored == {VALID: VALID, **dict.fromkeys(INVALID)}
    assert batch == {VALID}
