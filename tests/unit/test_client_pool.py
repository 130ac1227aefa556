"""The served benchmark's client (siglip_serve.measure.client_pool): a level's concurrency and requests split over
client processes, every request's outcome gathered from them, the bodies posted in one process's mix, the
client's own CPU measured and its processes kept out of the server's; `--client-processes` and its auto rule."""

from __future__ import annotations

import argparse
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from siglip_serve.measure import bench_cli
from siglip_serve.measure.client_pool import ClientPool, auto_client_processes, parse_client_processes, split
from siglip_serve.measure.served import drive
from siglip_serve.measure.server_cpu import ServerCpu


def test_split_shares_differ_by_at_most_one_and_sum_to_the_total() -> None:
    assert split(32, 3) == [11, 11, 10]
    assert split(7, 2) == [4, 3] and split(8, 8) == [1] * 8 and split(0, 2) == [0, 0]
    for total in range(0, 40):
        for parts in range(1, 9):
            shares = split(total, parts)
            assert sum(shares) == total and max(shares) - min(shares) <= 1 and shares == sorted(shares, reverse=True)
    with pytest.raises(ValueError):
        split(4, 0)


def test_auto_is_one_process_on_a_small_machine_else_one_per_four_cores_up_to_eight() -> None:
    assert [auto_client_processes(n) for n in (1, 2, 4, 5, 8, 16, 31, 32, 64, 192)] == [1, 1, 1, 1, 2, 4, 7, 8, 8, 8]


def test_the_option_takes_auto_or_a_positive_count() -> None:
    assert parse_client_processes("auto") is None and parse_client_processes("3") == 3
    args = bench_cli.build_parser().parse_args(["--client-processes", "2"])
    assert args.client_processes == 2
    assert bench_cli.build_parser().parse_args([]).client_processes is None  # auto, resolved by bench
    for bad in ("0", "-1", "many"):
        with pytest.raises((ValueError, argparse.ArgumentTypeError)):
            bench_cli.client_processes(bad)


class Recorder(BaseHTTPRequestHandler):
    """200 for any body but b"fail", which gets a 500; every body received is counted."""

    received: Counter[bytes] = Counter()
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.received[body] += 1
        self.send_response(500 if body == b"fail" else 200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    Recorder.received = Counter()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/embeddings/image"
    server.shutdown()
    server.server_close()


BODIES = [(b"a", "image/jpeg"), (b"b", "image/jpeg"), (b"fail", "image/jpeg")]


@pytest.mark.timeout(120)  # two spawned interpreters on the shared 2-core machine
def test_two_client_processes_drive_one_level_together(url: str) -> None:
    with ClientPool(BODIES, 2) as pool:
        assert len(pool.pids) >= 2
        # The server's accounting, as bench takes it, never counts a client process.
        server = ServerCpu.of_children(client=pool.pids)
        assert not set(server.snapshot()) & pool.pids
        row = drive(pool, url, concurrency=3, requests=7, images_per_request=2)
        # Bodies 0..6 over the two shares (4 from index 0, 3 from index 4): the mix one process posts.
        assert Recorder.received == Counter({b"a": 3, b"b": 2, b"fail": 2})
        assert row.requests == 7 and row.failures == 2 and row.concurrency == 3
        assert row.images_per_second > 0 and row.latency_p50_ms is not None and row.latency_p99_ms is not None
        assert row.latency_p50_ms <= row.latency_p99_ms
        client = row.client_cpu
        assert client is not None and client.client_processes == 2 and client.processes == 3
        assert client.seconds >= 0 and 0 <= client.busiest_process_core_fraction
        # Concurrency 1: one process takes the whole level, the other stays idle.
        Recorder.received = Counter()
        row = drive(pool, url, concurrency=1, requests=4)
        assert sum(Recorder.received.values()) == 4 and row.failures == 1


def test_one_client_process_drives_in_this_process(url: str) -> None:
    with ClientPool(BODIES, 1) as pool:
        assert pool.pids == set()
        row = drive(pool, url, concurrency=2, requests=5)
    assert Recorder.received == Counter({b"a": 2, b"b": 2, b"fail": 1}) and row.failures == 1
    assert row.client_cpu is not None and row.client_cpu.processes == 1 and row.client_cpu.client_processes == 1


@pytest.mark.timeout(120)
def test_a_client_process_error_is_raised_naming_the_process(url: str) -> None:
    closed = url.rsplit(":", 1)[0] + ":9/"  # the discard port: nothing listens on it here
    with ClientPool(BODIES, 2) as pool:
        with pytest.raises(RuntimeError, match=r"client process 0 \(pid \d+\): Connect.*; client process 1"):
            pool.run(closed, 2, 2)
        # Both answers were read: the next level gets its own.
        assert pool.run(url, 2, 4).failures == 1
