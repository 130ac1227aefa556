"""Opt-in OpenTelemetry traces: one span per stage of a request, linked from the ingress to the encoder
replica and its batch (docs/observability.md, "Tracing").

Off (the default) each stage costs one check of a module global: no OpenTelemetry import, no context
propagated, nothing allocated. On (`tracing: true`), every process of the app (ingress and encoder
replicas) exports its spans with OTLP over HTTP, configured by the standard environment
(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS,
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), or, with SIGLIP_TRACES_FILE set, as JSON lines into that
file (tests, and a look without a collector).

The spans: `http.request` (the ingress's handling, continuing a client's W3C `traceparent`), `decode`
(the request's images, checked and resized), `encode` (its wait for the towers), `render` (the answer's
body); in the replica `queue` (a request's chunk waiting for its batch: a child of the request's span)
and `batch` (one forward batch: its size and bucket, with a link to the span of every request in it, as
a batch serves many traces) with `forward` (the model's passes) inside. Why not Ray Serve's own tracing
(RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH, ray/serve/_private/tracing_utils.py): it spans Serve's calls,
and the ingress coalesces several requests into one call, so a call's span cannot say which request
waited where; both can run at once.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from siglip_serve.core.constants import TRACES_FILE_ENV
from siglip_serve.core.errors import UserError

# The tracer of this process, or None when tracing is off: the one thing the hot path looks at.
_tracer: Any = None
_provider: Any = None

Carrier = dict[str, str]


class TracingUnavailable(UserError, RuntimeError):
    """`tracing: true` without the OTLP exporter installed."""


def enabled() -> bool:
    return _tracer is not None


def configure(on: bool, process: str) -> None:
    """Set this process's tracer (`process`: "ingress", "encoder", "text-encoder"); off when not `on`."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()  # flushes what it holds
    _tracer = _provider = None
    if not on:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; ours come first so they win.
    service = os.environ.get("OTEL_SERVICE_NAME", "siglip-serve")
    provider = TracerProvider(resource=Resource.create({"service.name": service, "siglip.process": process}))
    path = os.environ.get(TRACES_FILE_ENV)
    if path:
        provider.add_span_processor(SimpleSpanProcessor(cast(Any, JsonLinesExporter(path))))
    else:
        provider.add_span_processor(BatchSpanProcessor(otlp_exporter()))
    # Our own provider, not the global one: Ray may set that for its own tracing.
    _provider = provider
    _tracer = provider.get_tracer("siglip_serve")


def flush(timeout_s: float = 10.0) -> bool:
    """Export what is buffered now (the batch processor sends every few seconds)."""
    return True if _provider is None else bool(_provider.force_flush(int(timeout_s * 1000)))


def otlp_exporter() -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TracingUnavailable("tracing: true needs the OTLP exporter: pip install 'siglip-serve[tracing]' "
                                 "(opentelemetry-exporter-otlp-proto-http), or set tracing: false") from None
    return OTLPSpanExporter()  # endpoint, headers and timeout from the OTEL_EXPORTER_OTLP_* environment


def replica_env(on: bool) -> dict[str, str]:
    """What the app's processes need from the environment of the one that builds it: the OTEL_* settings
    and SIGLIP_TRACES_FILE (a Serve YAML deploy's replicas do not inherit the deploying shell's)."""
    if not on:
        return {}
    return {k: v for k, v in os.environ.items() if k.startswith("OTEL_") or k == TRACES_FILE_ENV}


def check_available() -> None:
    """At start, before any replica: refuse `tracing: true` without the exporter, in one line."""
    if not os.environ.get(TRACES_FILE_ENV):
        otlp_exporter()


# What `span` gives when tracing is off: one shared no-op context manager (stateless, so reusable).
_OFF: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()


def span(name: str, parent: Any = None, links: Sequence[Any] = (), attributes: Mapping[str, Any] | None = None,
         **more: Any) -> contextlib.AbstractContextManager[Any]:
    """A span named `name` (None when tracing is off), a child of `parent` (a context from `extract`, or
    the current span), with `links` (contexts) and `attributes` (dotted names) and `more`."""
    if _tracer is None:
        return _OFF
    return _span(name, parent, links, {**(attributes or {}), **more})


@contextlib.contextmanager
def _span(name: str, parent: Any, links: Sequence[Any], attributes: Mapping[str, Any]) -> Iterator[Any]:
    from opentelemetry import trace

    span_links = [trace.Link(trace.get_current_span(c).get_span_context()) for c in links if c is not None]
    values = {k: v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(name, context=parent, links=span_links, attributes=values) as current:
        yield current


def record(name: str, parent: Any, start_ns: int, end_ns: int, **attributes: Any) -> None:
    """A span that has already happened (a wait measured by its ends), a child of `parent`."""
    if _tracer is None:
        return
    done = _tracer.start_span(name, context=parent, start_time=start_ns,
                              attributes={k: v for k, v in attributes.items() if v is not None})
    done.end(end_time=end_ns)


def inject() -> Carrier | None:
    """The current span's W3C trace context for another process (None when tracing is off)."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: Carrier = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> Any:
    """A context from `inject`'s carrier, or from a request's headers (`traceparent`); None if none."""
    if _tracer is None or not carrier:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)


def annotate(**attributes: Any) -> None:
    """Set attributes on the current span (nothing when tracing is off)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes({k: v for k, v in attributes.items() if v is not None})


class JsonLinesExporter:
    """Each finished span as one JSON line (name, ids, parent, links, attributes, process, times)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        with open(self.path, "a", encoding="utf-8") as out:
            for s in spans:
                context = s.get_span_context()
                out.write(json.dumps({
                    "name": s.name, "trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}",
                    "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                    "links": [{"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
                              for link in s.links],
                    "attributes": dict(s.attributes or {}), "process": s.resource.attributes.get("siglip.process"),
                    "start_ns": s.start_time, "end_ns": s.end_time,
                }) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
