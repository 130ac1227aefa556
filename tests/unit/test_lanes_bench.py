"""measure/lanes_bench.py (tools/lanes_bench.py's command): the figures from its streams' rows (the p99 ratios and
the backfill's kept share), and a window's streams split over processes against a stand-in server."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from siglip_serve.measure import lanes_bench as lb


def test_a_stream_is_summarized_by_its_answered_requests_and_percentiles() -> None:
    row = lb.summarize(lb.Stream("s", 2, None, 0), [0.01] * 99 + [0.5], failures=3, seconds=10.0)
    assert (row.answered, row.failures, row.requests_per_second) == (100, 3, 10.0)
    assert row.p50_ms == 10.0 and 10.0 < (row.p99_ms or 0) <= 500.0
    empty = lb.summarize(lb.Stream("s", 2, None, 0), [], failures=5, seconds=10.0)
    assert empty.p99_ms is None and empty.requests_per_second == 0.0


def test_the_ratios_compare_each_stream_beside_the_other_with_it_alone() -> None:
    def row(name: str, rps: float, p99: float) -> lb.StreamResult:
        return lb.StreamResult(name, 2, int(rps * 10), 0, 10.0, rps, p99 / 2, p99)

    rows = {"interactive-alone": [row("interactive", 40, 30)], "bulk-alone": [row("bulk", 100, 400)],
            "mixed": [row("interactive", 20, 45), row("bulk", 72, 500)],
            "small-alone": [row("small", 40, 30)], "tenants": [row("large", 90, 700), row("small", 30, 60)]}
    figures = lb.ratios(rows)
    assert figures["interactive_p99_beside_bulk_over_alone"] == 1.5
    assert figures["bulk_kept_of_alone_minus_interactive"] == 0.9  # 72 of (100 - 20)
    assert figures["small_tenant_p99_beside_large_over_alone"] == 2.0
    assert figures["large_tenant_requests_per_second"] == 90
    # Windows left out (--windows): their ratios are null, the others stand.
    only_tenants = lb.ratios({"small-alone": rows["small-alone"], "tenants": rows["tenants"]})
    assert only_tenants == {"interactive_p99_beside_bulk_over_alone": None,
                            "bulk_kept_of_alone_minus_interactive": None,
                            "small_tenant_p99_beside_large_over_alone": 2.0, "large_tenant_requests_per_second": 90}


def test_the_heavy_streams_take_the_clients_and_processes_given() -> None:
    streams = lb.streams_of("A", "B", bulk_clients=128, large_clients=96, processes=4)
    assert [(s.name, s.clients, s.key, s.priority, s.processes) for s in streams["mixed"]] == [
        ("interactive", 2, "A", 0, 1), ("bulk", 128, "A", 2, 4)]
    assert [(s.name, s.clients, s.key, s.priority, s.processes) for s in streams["tenants"]] == [
        ("large", 96, "A", None, 4), ("small", 2, "B", None, 1)]
    assert lb.build_parser().parse_args(["--client-processes", "auto"]).client_processes >= 1
    with pytest.raises(SystemExit):
        lb.build_parser().parse_args(["--windows", "mixed,bogus"])


@pytest.fixture
def stand_in() -> Iterator[tuple[str, list[tuple[str | None, str | None]]]]:
    """A server that answers every POST 200 and notes each request's key and X-Priority."""
    seen: list[tuple[str | None, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.headers.get("Authorization"), self.headers.get("X-Priority")))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/embeddings/image", seen
    finally:
        server.shutdown()


@pytest.mark.timeout(120)
def test_a_window_runs_each_stream_over_its_processes_at_once(
        stand_in: tuple[str, list[tuple[str | None, str | None]]]) -> None:
    url, seen = stand_in
    streams = [lb.Stream("bulk", 4, "key-a", 2, processes=2), lb.Stream("interactive", 2, "key-a", 0)]
    rows, cpu = lb.window(url, streams, 1.0, [(b"\xff\xd8 not a real jpeg", "image/jpeg")])
    assert cpu is None  # no server process to account
    bulk, interactive = rows
    # The bulk stream's two processes' requests are gathered into one row with every client.
    assert (bulk.name, bulk.clients, interactive.name, interactive.clients) == ("bulk", 4, "interactive", 2)
    assert bulk.answered > 0 and interactive.answered > 0 and bulk.failures == interactive.failures == 0
    assert 0.9 <= bulk.seconds < 5 and bulk.p99_ms is not None
    assert {("Bearer key-a", "2"), ("Bearer key-a", "0")} == set(seen)
    assert len(seen) == bulk.answered + interactive.answered


@pytest.mark.timeout(60)
def test_a_stream_builds_its_client_before_it_says_ready_and_posts_nothing_before_the_start(
        stand_in: tuple[str, list[tuple[str | None, str | None]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine can stretch the client's set-up (httpx's import, its SSL context) past a short window:
    the set-up comes before "ready", and the window is the stream's from the start it is given."""
    import httpx

    url, seen = stand_in
    built: list[float] = []

    class Recorded(httpx.AsyncClient):
        def __init__(self, **kwargs: object) -> None:
            built.append(time.time())
            super().__init__(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(httpx, "AsyncClient", Recorded)
    ours, theirs = multiprocessing.Pipe()
    stream = threading.Thread(target=lb._stream_process, daemon=True,
                              args=(theirs, url, lb.Stream("s", 2, None, 0), [(b"x", "image/jpeg")], 0.5))
    stream.start()
    assert ours.poll(30) and ours.recv() == "ready" and len(built) == 1
    time.sleep(0.3)
    assert seen == []  # ready, and waiting for the start
    start_at = time.time() + 0.2
    ours.send(start_at)
    assert ours.poll(30)
    latencies, failures, seconds = ours.recv()
    stream.join(timeout=10)
    assert len(latencies) == len(seen) > 0 and failures == 0 and 0.5 <= seconds < 5
