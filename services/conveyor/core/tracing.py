"""OpenTelemetry tracing: one trace from the submit request to every attempt of its job.

The only module that imports OpenTelemetry. Tracing is on when the SDK is installed (the extra
``conveyor[otel]``) and the standard variables ask for it (``configure``): ``OTEL_TRACES_EXPORTER``
(``console``, ``otlp``, … ; ``none`` turns it off) or an ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``;
``OTEL_SDK_DISABLED=true`` wins. Everything else (service name, resource attributes, sampler,
batch processor, OTLP endpoint and headers) is read by the SDK from its own ``OTEL_*`` variables.
Off, every hook below is one test of ``_tracer is None``.

How a trace is carried (a W3C ``traceparent``, stored as text):

- ``POST /jobs`` and ``/jobs/batch``: a server span (child of an incoming ``traceparent``
  header) and in it a ``conveyor.submit`` span around the insert; its context is stored with
  the job(s) (``jobs.trace_context``). With tracing off, a valid incoming ``traceparent`` is
  stored as it is; ``enqueue()`` stores the caller's current span (an instrumented app);
- the relay reads it with the outbox row, publishes in a ``conveyor.publish`` span (its child)
  and sends that span's context as the message header ``traceparent``;
- the worker's ``conveyor.attempt`` span of each attempt is a child of the delivery's
  ``traceparent`` header, or of the job's stored context (from the claim) when the message has
  none; the handler runs inside it, so its own spans nest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from importlib.metadata import entry_points
from typing import Any

from .logging import event

log = logging.getLogger("conveyor.tracing")

HEADER = "traceparent"
# W3C Trace Context, version 00: 55 lower-case characters; all-zero ids are invalid
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")

_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_provider: Any = None  # its provider (``flush``)


def valid(value: Any) -> str | None:
    """``value`` when it is a well-formed ``traceparent`` (version 00), else None: a header is
    client input, and only this is ever stored."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str) or len(value) != 55:
        return None
    return value if _TRACEPARENT.fullmatch(value) else None


def enabled() -> bool:
    return _tracer is not None


def install(provider: Any) -> None:
    """Trace with ``provider`` (an SDK ``TracerProvider``): ``configure`` does it from the
    environment; tests pass one with an in-memory exporter."""
    global _tracer, _provider
    _tracer = provider.get_tracer("conveyor")
    _provider = provider


def uninstall() -> None:
    global _tracer, _provider
    _tracer = _provider = None


def flush(timeout: float = 2.0) -> None:
    """Export the spans still batched, waiting at most ``timeout``: for an exit that skips
    ``atexit`` (the SDK's own flush), such as the worker's ``os._exit``."""
    force = getattr(_provider, "force_flush", None)
    if force is not None:
        force(int(timeout * 1000))


def _wanted(env: os._Environ[str] | dict[str, str]) -> list[str]:
    """The exporters the standard variables ask for (none: tracing stays off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = env.get("OTEL_TRACES_EXPORTER")
    if names is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        names = "otlp" if endpoint else ""
    return [n for n in (s.strip() for s in names.split(",")) if n and n != "none"]


def configure(service_name: str, env: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Turn tracing on when the ``OTEL_*`` variables ask for it and the SDK is installed.
    ``service_name`` is the default of ``OTEL_SERVICE_NAME``. Returns whether it is on."""
    names = _wanted(env)
    if not names:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        event(
            log,
            "tracing_unavailable",
            logging.WARNING,
            exporters=",".join(names),
            fix="pip install 'conveyor[otel]'",
        )
        return False
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER(_ARG)
    found = {e.name: e for e in entry_points(group="opentelemetry_traces_exporter")}
    for name in names:
        # "otlp" is the gRPC exporter's name; the extra brings OTLP over HTTP
        ep = found.get(name) or (found.get("otlp_proto_http") if name == "otlp" else None)
        if ep is None:
            event(
                log,
                "tracing_exporter_unknown",
                logging.WARNING,
                exporter=name,
                known=",".join(sorted(found)),
            )
            continue
        provider.add_span_processor(BatchSpanProcessor(ep.load()()))  # OTEL_BSP_*
    trace.set_tracer_provider(provider)  # the handlers' own spans go there too
    install(trace.get_tracer_provider())
    event(
        log,
        "tracing_configured",
        exporters=",".join(names),
        service=str(provider.resource.attributes.get(SERVICE_NAME)),
    )
    return True


def _traceparent(span: Any) -> str | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _context(traceparent: str | None) -> Any:
    """An OpenTelemetry context whose parent is ``traceparent`` (None: the current context)."""
    if traceparent is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({HEADER: traceparent})


def current() -> str | None:
    """The caller's current span as a ``traceparent`` (an application that traces and calls
    ``enqueue()``), or None. Imports nothing: without OpenTelemetry loaded there is no span."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    return _traceparent(trace.get_current_span())


def submitting(
    route: str | None, incoming: str | None = None
) -> contextlib.AbstractContextManager[str | None]:
    """Around a submit: yields the ``traceparent`` to store with the job(s). ``route``: the API
    route (a server span is started for it, child of ``incoming``); None for ``enqueue()``,
    whose caller's span is the parent."""
    if _tracer is None:  # the context to store, no span
        return contextlib.nullcontext(valid(incoming) if incoming is not None else current())
    return _submitting(route, valid(incoming))


@contextlib.contextmanager
def _submitting(route: str | None, incoming: str | None) -> Iterator[str | None]:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    with contextlib.ExitStack() as stack:
        parent = _context(incoming)
        if trace.get_current_span().get_span_context().is_valid:
            # FastAPI's own server span (it makes one once a global provider is set, from the
            # incoming traceparent), an ASGI instrumentation's, or enqueue()'s caller's
            route, parent = None, None
        if route is not None:
            server = _tracer.start_as_current_span(
                f"POST {route}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes={"http.request.method": "POST", "http.route": route},
            )
            stack.enter_context(server)
            parent = None  # the server span is now current
        span = stack.enter_context(
            _tracer.start_as_current_span("conveyor.submit", context=parent, kind=SpanKind.PRODUCER)
        )
        yield _traceparent(span)


def annotate_submit(job_types: Sequence[str], count: int, job_id: Any = None) -> None:
    """Name the submitted job(s) on the current ``conveyor.submit`` span (no-op when off):
    the type, or for a batch of several types the distinct types."""
    if _tracer is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    distinct = sorted(set(job_types))
    if len(distinct) == 1:
        span.set_attribute("conveyor.job.type", distinct[0])
    elif distinct:
        span.set_attribute("conveyor.job.types", distinct[:100])
    span.set_attribute("conveyor.job.count", count)
    if job_id is not None:
        span.set_attribute("conveyor.job.id", str(job_id))


def start_publishing(rows: Sequence[Any]) -> tuple[list[Any], list[str | None]]:
    """One ``conveyor.publish`` span per outbox row that carries a trace context (its child);
    returns the spans and the ``traceparent`` header of each row's message (None: none)."""
    from opentelemetry.trace import SpanKind

    spans: list[Any] = []
    headers: list[str | None] = []
    for row in rows:
        context = getattr(row, "trace_context", None)
        if context is None:
            spans.append(None)
            headers.append(None)
            continue
        span = _tracer.start_span(
            "conveyor.publish",
            context=_context(context),
            kind=SpanKind.PRODUCER,
            attributes={
                "conveyor.job.id": str(row.job_id),
                "conveyor.job.type": row.job_type,
                "conveyor.destination": row.destination,
            },
        )
        spans.append(span)
        headers.append(_traceparent(span))
    return spans, headers


def end_publishing(spans: Sequence[Any], results: Sequence[BaseException | None]) -> None:
    from opentelemetry.trace import StatusCode

    for span, result in zip(spans, results, strict=True):
        if span is None:
            continue
        if result is not None:
            span.record_exception(result)
            span.set_status(StatusCode.ERROR, type(result).__name__)
        span.end()


@contextlib.contextmanager
def attempt(job_type: str, job_id: Any, number: int, parent: str | None) -> Iterator[Any]:
    """The ``conveyor.attempt`` span of one attempt, current while its handler runs (call only
    when ``enabled()``)."""
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
        "conveyor.attempt",
        context=_context(parent),
        kind=SpanKind.CONSUMER,
        attributes={
            "conveyor.job.id": str(job_id),
            "conveyor.job.type": job_type,
            "conveyor.job.attempt": number,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def attempt_outcome(span: Any, outcome: str, error: str | None) -> None:
    from opentelemetry.trace import StatusCode

    span.set_attribute("conveyor.outcome", outcome)
    if error is not None:
        lines = error.strip().splitlines()
        span.set_status(StatusCode.ERROR, lines[-1][:200] if lines else None)
