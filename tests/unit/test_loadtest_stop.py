"""The end of a load test: the requests in flight when the run time is up are answered and counted.

A server that embeds an image counts it whether or not the client is still waiting; a load test that
dropped its requests in flight at the end counted fewer images than the server, and its metrics
cross-check failed on a slow server (one request in flight per user is a large share of a short run).
Here a stand-in server on loopback answers each request slowly, counts the images it answered and
exports the count as Prometheus text: the real `siglip-serve loadtest` (Locust in a subprocess) runs
against it. The stand-in proves nothing about siglip-serve's own answers (its embeddings are zeros).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from siglip_serve.loadtest import cli
from siglip_serve.loadtest.promtext import IMAGES_METRIC

DIM = 4
ANSWER_S = 1.2  # longer than half the run, so each user has a request in flight when the run time is up


class SlowEmbedder(BaseHTTPRequestHandler):
    answered = 0
    lock = threading.Lock()

    def log_message(self, *_args: object) -> None:
        pass

    def _send(self, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            with self.lock:
                count = SlowEmbedder.answered
            self._send(f'{IMAGES_METRIC}{{application="stand-in"}} {count}\n'.encode(), "text/plain")
        elif self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "stand-in", "embedding_dim": DIM}]}).encode())
        else:
            self._send(b"{}")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(ANSWER_S)
        with self.lock:
            SlowEmbedder.answered += 1  # counted as the server embeds it, before the answer is sent
        self._send(json.dumps({"data": [{"embedding": [0.0] * DIM}]}).encode())


@pytest.fixture
def slow_server() -> Iterator[str]:
    SlowEmbedder.answered = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowEmbedder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_requests_in_flight_at_the_end_are_answered_and_counted_by_both_sides(
        tmp_path: Path, slow_server: str) -> None:
    out = tmp_path / "out"
    code = cli.main(["--host", slow_server, "--out", str(out), "--users", "2", "--run-time", "2s",
                     "--endpoint", "raw", "--metrics-url", f"{slow_server}/metrics", "--metrics-wait", "5",
                     "--p99-target-ms", "60000"])
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0, summary
    # Each user had a request in flight when the two seconds were up (two rounds each, on a quiet machine).
    assert summary["failures"] == 0 and summary["requests"] == SlowEmbedder.answered >= 2
    check = summary["metrics_check"]
    assert check["server_images"] == check["client_images"] == summary["images"], check
    assert check["agrees"] is True
