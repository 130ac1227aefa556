"""serve/shared/tracing.py: off costs nothing and sends nothing; on, spans nest, link and cross processes by W3C
trace context, and the OTLP exporter posts them to the endpoint the standard environment names."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from siglip_serve.serve.shared import tracing


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, into the SDK's in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    yield exporter


def test_off_creates_nothing_and_propagates_nothing() -> None:
    tracing.configure(False, "ingress")
    assert not tracing.enabled()
    with tracing.span("http.request", attributes={"a": 1}) as current:
        assert current is None
    assert tracing.inject() is None
    assert tracing.extract({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
    tracing.record("queue", None, 0, 1)
    tracing.annotate(status=200)


def test_a_request_crosses_processes_and_its_batch_links_back(spans: InMemorySpanExporter) -> None:
    client = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    with tracing.span("http.request", parent=tracing.extract({"traceparent": client}),
                      attributes={"siglip.request_id": "r1", "skipped": None}):
        with tracing.span("encode", tower="image"):
            carrier = tracing.inject()  # what the ingress sends with the chunk
        tracing.annotate(**{"http.response.status_code": 200})
    assert carrier is not None and set(carrier) == {"traceparent"}
    # The replica's side: the wait as it happened, and the batch that served it.
    context = tracing.extract(carrier)
    tracing.record("queue", context, 1_000, 2_000)
    with tracing.span("batch", links=[context], size=3, bucket=4), tracing.span("forward"):
        pass
    by_name = {s.name: s for s in spans.get_finished_spans()}
    request, encode, queue, batch, forward = (by_name[n] for n in
                                              ("http.request", "encode", "queue", "batch", "forward"))
    assert request.context.trace_id == int("a" * 32, 16) and request.parent.span_id == int("b" * 16, 16)
    assert dict(request.attributes) == {"siglip.request_id": "r1", "http.response.status_code": 200}
    assert encode.parent.span_id == request.context.span_id
    assert queue.context.trace_id == request.context.trace_id and queue.parent.span_id == encode.context.span_id
    assert (queue.start_time, queue.end_time) == (1_000, 2_000)
    assert [link.context.span_id for link in batch.links] == [encode.context.span_id]
    assert dict(batch.attributes) == {"size": 3, "bucket": 4} and forward.parent.span_id == batch.context.span_id


def test_otlp_posts_to_the_standard_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    posts: list[tuple[str, str, int]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            posts.append((self.path, self.headers["Content-Type"], len(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.delenv("SIGLIP_TRACES_FILE", raising=False)
    try:
        tracing.configure(True, "ingress")
        with tracing.span("http.request"):
            pass
        assert tracing.flush()
    finally:
        tracing.configure(False, "ingress")
        server.shutdown()
    assert posts and posts[0][0] == "/v1/traces" and posts[0][1] == "application/x-protobuf" and posts[0][2] > 0


def test_tracing_without_the_exporter_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_otlp(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("opentelemetry.exporter.otlp"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.delenv("SIGLIP_TRACES_FILE", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_otlp)
    with pytest.raises(tracing.TracingUnavailable, match=r"siglip-serve\[tracing\]"):
        tracing.check_available()
