"""Tracing's switches and inputs (``core/tracing.py``): only the standard ``OTEL_*`` variables
turn it on, ``OTEL_SDK_DISABLED`` and ``none`` keep it off, a missing SDK is one log line, and
only a well-formed ``traceparent`` is ever stored. ``configure`` sets the process-wide provider,
so it runs in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conveyor.core import tracing

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, []),  # nothing asked: off, even with the SDK installed
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, []),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, ["console"]),
    ],
)
def test_only_the_standard_variables_turn_it_on(env: dict[str, str], wanted: list[str]) -> None:
    assert tracing._wanted(env) == wanted


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        VALID.upper(),
        VALID[:-1],
        VALID + "-00",
        "01" + VALID[2:],  # another version: not what we store
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",
        "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
        "\u0660" * 55,
        42,
    ],
)
def test_a_malformed_traceparent_is_never_taken(value: object) -> None:
    assert tracing.valid(value) is None


def test_a_valid_traceparent_is_taken_as_text_or_bytes() -> None:
    assert tracing.valid(VALID) == VALID
    assert tracing.valid(VALID.encode()) == VALID


def test_off_costs_no_span() -> None:
    assert not tracing.enabled()
    with tracing.submitting("/jobs", VALID) as ctx:
        assert ctx == VALID
    with tracing.submitting("/jobs", "junk") as ctx:
        assert ctx is None
    tracing.annotate_submit(["t"], 1)  # a no-op, never an error


SCRIPT = """
import json, sys
from conveyor.core import tracing
from conveyor.core.logging import configure
configure()
on = tracing.configure("conveyor-test")
result = {"on": on}
if on:
    with tracing.submitting("/jobs") as ctx:
        result["ctx"] = ctx
print("RESULT " + json.dumps(result), file=sys.stderr, flush=True)
"""


def _run(env: dict[str, str], *, no_sdk: bool = False) -> tuple[dict[str, object], str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    script = SCRIPT
    if no_sdk:  # as if the extra were not installed
        script = "import sys; sys.modules['opentelemetry.sdk'] = None\n" + script
    p = subprocess.run([sys.executable, "-c", script], env={**base, **env},
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stderr.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), p.stdout, p.stderr


def test_the_console_exporter_prints_the_spans_at_exit() -> None:
    result, out, _ = _run({"OTEL_TRACES_EXPORTER": "console"})
    assert result["on"] is True and tracing.valid(result["ctx"]) == result["ctx"]
    assert '"name": "POST /jobs"' in out and '"name": "conveyor.submit"' in out
    assert '"service.name": "conveyor-test"' in out
    trace_id = str(result["ctx"]).split("-")[1]
    assert f'"trace_id": "0x{trace_id}"' in out
    _, out, _ = _run({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "billing-api"})
    assert '"service.name": "billing-api"' in out


def test_disabled_or_missing_sdk_leaves_tracing_off() -> None:
    assert _run({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})[0] == {
        "on": False
    }
    assert _run({"OTEL_TRACES_EXPORTER": "none"})[0] == {"on": False}
    result, out, err = _run({"OTEL_TRACES_EXPORTER": "console"}, no_sdk=True)
    assert result == {"on": False} and out == ""
    assert "tracing_unavailable" in err and "conveyor[otel]" in err


def test_inside_a_server_span_already_made_the_submit_is_its_child() -> None:
    """FastAPI makes the request's server span itself once a global provider is set (and an
    ASGI instrumentation would): Conveyor then adds only its submit span, never a second
    server span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    try:
        fastapi = provider.get_tracer("fastapi")
        with (
            fastapi.start_as_current_span("POST") as server,
            tracing.submitting("/jobs", VALID) as ctx,
        ):
            pass
        with tracing.submitting("/jobs", VALID) as alone:
            pass
    finally:
        tracing.uninstall()
    names = [(s.name, s.parent.span_id if s.parent else None) for s in spans.get_finished_spans()]
    sid = server.get_span_context().span_id
    first, second = names[:2], names[2:]
    assert first[0][0] == "conveyor.submit" and first[0][1] == sid and first[1] == ("POST", None)
    assert ctx is not None and ctx.split("-")[1] == f"{server.get_span_context().trace_id:032x}"
    # no span current: Conveyor's server span continues the incoming traceparent
    assert [n for n, _ in second] == ["conveyor.submit", "POST /jobs"]
    assert second[1][1] == int(VALID.split("-")[2], 16)
    assert alone is not None and alone.split("-")[1] == VALID.split("-")[1]


def test_a_failed_publish_ends_its_span_as_an_error() -> None:
    import uuid
    from types import SimpleNamespace

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    provider = TracerProvider()
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    try:
        rows = [
            SimpleNamespace(job_id=uuid.uuid4(), job_type="t", destination="work",
                            trace_context=VALID),
            SimpleNamespace(job_id=uuid.uuid4(), job_type="t", destination="work",
                            trace_context=None),  # a job submitted without a trace
        ]  # fmt: skip
        started, headers = tracing.start_publishing(rows)
        assert headers[1] is None and started[1] is None
        assert tracing.valid(headers[0]) and headers[0].split("-")[1] == VALID.split("-")[1]
        tracing.end_publishing(started, [ConnectionError("channel closed"), None])
    finally:
        tracing.uninstall()
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.parent is not None
    assert span.parent.span_id == int(VALID.split("-")[2], 16)
    assert span.events[0].name == "exception"


def test_the_workers_hard_exit_still_exports_the_spans() -> None:
    """``worker/exiting.hard_exit`` ends the process with ``os._exit``, which skips the SDK's
    ``atexit`` flush: the spans of the worker's last jobs, still in the batch processor, were
    lost at every worker exit. The batch delay is a minute here, so only the exit's own flush
    can print them."""
    script = SCRIPT.replace("print(", "from conveyor.worker.exiting import hard_exit\nprint(")
    script += "hard_exit(0)\n"
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "60000"}
    p = subprocess.run([sys.executable, "-c", script], env={**base, **env},
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert '"name": "conveyor.submit"' in p.stdout, p.stdout[-500:]
