"""HAProxy's queue in lane order (launcher/haproxy_front.py `_lane_rules`, core/lanes.py): the real binary, one
request at work at a time, the order in which queued requests reach the ingress, a key with fewer requests in
HAProxy before one with more in the same lane, and the lower lane shed first."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from siglip_serve.core.front_door import FrontDoorLimits, write_limits
from siglip_serve.launcher import haproxy_front
from siglip_serve.launcher.haproxy_front import rewrite_config
from siglip_serve.launcher.preflight import free_port
from tests.real_haproxy import RAY_TEMPLATE, TEMPLATE_HEAD, error_dir, running_haproxy

INTERACTIVE_KEY = "key-of-search"


class _Recording(BaseHTTPRequestHandler):
    """Holds /first while the others queue behind it, answers the rest quickly, and records the order requests
    reached it in."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        time.sleep(1.5 if self.path == "/first" else 0.02)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def front_end(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[int]:
    """HAProxy with 1 request at work and `queued` (the test's param, default 10) waiting; one key in the
    lane map (interactive)."""
    queued = getattr(request, "param", 10)
    _Recording.seen = []
    ingress = ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    ingress.daemon_threads = True
    threading.Thread(target=ingress.serve_forever, daemon=True).start()
    digest = hashlib.sha256(INTERACTIVE_KEY.encode()).hexdigest()
    write_limits(FrontDoorLimits(1, queued, 10.0, 1), "siglip", str(tmp_path / "limits"), lane_map=f"{digest} 0\n")
    port = free_port()
    config = rewrite_config(RAY_TEMPLATE.format(port=port, ingress=ingress.server_address[1]), 10, True,
                            error_dir(tmp_path), tmp_path / "limits")
    try:
        with running_haproxy(config, tmp_path, port):
            yield port
    finally:
        ingress.shutdown()
        ingress.server_close()


def _send(port: int, path: str, headers: dict[str, str], answers: dict[str, int]) -> threading.Thread:
    def ask() -> None:
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{lines}Connection: close\r\n\r\n".encode())
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        answers[path] = int(reply.split()[1])

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(0.05)  # each joins the queue after the one before
    return thread


def test_the_queue_serves_a_higher_lane_first_and_the_key_names_the_default_lane(front_end: int) -> None:
    answers: dict[str, int] = {}
    bearer = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}
    threads = [_send(front_end, "/first", {}, answers),
               _send(front_end, "/bulk-1", {"X-Priority": "2"}, answers),
               _send(front_end, "/bulk-2", {"X-Priority": "7"}, answers),
               _send(front_end, "/default", {}, answers),
               # The interactive key, moved down by its own header: bulk, behind the default request.
               _send(front_end, "/key-demoted", {**bearer, "X-Priority": "2"}, answers),
               _send(front_end, "/interactive-key", bearer, answers),
               # A header cannot move a request up: the default lane.
               _send(front_end, "/asks-up", {"X-Priority": "0"}, answers)]
    for thread in threads:
        thread.join()
    assert set(answers.values()) == {200}
    assert _Recording.seen == ["/first", "/interactive-key", "/default", "/asks-up", "/bulk-1", "/bulk-2",
                               "/key-demoted"]


@pytest.mark.parametrize("front_end", [4], indirect=True)
def test_the_bulk_lane_is_shed_first(front_end: int) -> None:
    """4 may wait: bulk is refused from 2 waiting, default from 3, interactive at 4."""
    answers: dict[str, int] = {}
    threads = [_send(front_end, "/first", {}, answers),
               _send(front_end, "/bulk-1", {"X-Priority": "2"}, answers),
               _send(front_end, "/bulk-2", {"X-Priority": "2"}, answers),
               _send(front_end, "/bulk-3", {"X-Priority": "2"}, answers),
               _send(front_end, "/default", {}, answers),
               _send(front_end, "/default-2", {}, answers),
               _send(front_end, "/interactive", {"Authorization": f"Bearer {INTERACTIVE_KEY}"}, answers)]
    for thread in threads:
        thread.join()
    assert answers == {"/first": 200, "/bulk-1": 200, "/bulk-2": 200, "/bulk-3": 503, "/default": 200,
                       "/default-2": 503, "/interactive": 200}


@pytest.fixture
def second_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant step of a whole second, so that requests sent 50 ms apart show the order it makes."""
    monkeypatch.setattr(haproxy_front, "TENANT_STEP_S", 1.0)


def test_within_a_lane_a_key_with_fewer_requests_in_haproxy_goes_first(second_steps: None, front_end: int) -> None:
    answers: dict[str, int] = {}
    many, few = {"Authorization": "Bearer tenant-with-many"}, {"Authorization": "Bearer tenant-with-few"}
    threads = [_send(front_end, "/first", many, answers),
               *[_send(front_end, f"/many-{i}", many, answers) for i in range(1, 5)],
               _send(front_end, "/few", few, answers),
               _send(front_end, "/anonymous", {}, answers)]  # no key: not tracked, no tenant step
    for thread in threads:
        thread.join()
    assert set(answers.values()) == {200}
    # The key with five requests in HAProxy (one at work) queues its fifth 5 s back, the one with one 1 s back.
    assert _Recording.seen == ["/first", "/anonymous", "/few", "/many-1", "/many-2", "/many-3", "/many-4"]
    # The count is of requests in HAProxy now, not of every request so far: with its requests answered, the
    # busy key's next request queues 1 s back as the other's does, and arrival decides.
    _Recording.seen = []
    threads = [_send(front_end, "/first", {}, answers), _send(front_end, "/many-again", many, answers),
               _send(front_end, "/few-again", few, answers)]
    for thread in threads:
        thread.join()
    assert _Recording.seen == ["/first", "/many-again", "/few-again"]


# Two ingress replicas of one application; `{kept_state}` and `{other_state}` take one out of service.
TWO_REPLICAS = TEMPLATE_HEAD + """    default_backend http-siglip
backend http-siglip
    balance leastconn
    server SERVE_REPLICA_siglip-Ingress-b 127.0.0.1:{other}{other_state}
    server SERVE_REPLICA_siglip-Ingress-a 127.0.0.1:{kept}{kept_state}
"""


def _recorder() -> tuple[ThreadingHTTPServer, list[str]]:
    handler = type("_Replica", (_Recording,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler.seen


@pytest.mark.parametrize("down", ["none", "kept", "other"])
def test_interactive_ingress_keeps_the_first_replica_by_name_for_the_interactive_lane(tmp_path: Path,
                                                                                      down: str) -> None:
    """interactive_ingress (launcher/haproxy_front.py `_kept_for_interactive`): the interactive key's requests all
    meet the first replica by name and no other request does, whatever the balancing's count; with that replica down
    the lane goes to the others; with the others down the lane is still served and the other lanes are not ready."""
    (kept, kept_seen), (other, other_seen) = _recorder(), _recorder()
    digest = hashlib.sha256(INTERACTIVE_KEY.encode()).hexdigest()
    write_limits(FrontDoorLimits(4, 8, 10.0, 1, interactive_server=True), "siglip", str(tmp_path / "limits"),
                 lane_map=f"{digest} 0\n")
    port = free_port()
    template = TWO_REPLICAS.format(port=port, other=other.server_address[1], kept=kept.server_address[1],
                                   kept_state=" disabled" if down == "kept" else "",
                                   other_state=" disabled" if down == "other" else "")
    config = rewrite_config(template, 10, True, error_dir(tmp_path), tmp_path / "limits")
    assert "use-server SERVE_REPLICA_siglip-Ingress-a if" in config
    answers: dict[str, int] = {}
    try:
        with running_haproxy(config, tmp_path, port):
            bearer = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}
            threads = [*[_send(port, f"/interactive-{i}", bearer, answers) for i in range(4)],
                       *[_send(port, f"/default-{i}", {}, answers) for i in range(4)],
                       _send(port, "/bulk", {"X-Priority": "2"}, answers),
                       _send(port, "/interactive-demoted", {**bearer, "X-Priority": "1"}, answers)]
            for thread in threads:
                thread.join()
    finally:
        for server in (kept, other):
            server.shutdown()
            server.server_close()
    interactive = {f"/interactive-{i}" for i in range(4)}
    assert set(answers) == interactive | {f"/default-{i}" for i in range(4)} | {"/bulk", "/interactive-demoted"}
    if down == "other":
        assert set(kept_seen) == interactive and other_seen == []
        assert answers == {path: 200 if path in interactive else 503 for path in answers}
        return
    assert set(answers.values()) == {200}
    if down == "kept":
        assert kept_seen == [] and set(other_seen) == set(answers)
    else:
        assert set(kept_seen) == interactive
        assert set(other_seen) == set(answers) - interactive


def test_interactive_ingress_keeps_nothing_apart_with_one_replica(tmp_path: Path) -> None:
    write_limits(FrontDoorLimits(4, 8, 10.0, 1, interactive_server=True), "siglip", str(tmp_path / "limits"))
    config = rewrite_config(RAY_TEMPLATE.format(port=1, ingress=2), 10, True, tmp_path, tmp_path / "limits")
    assert "use-server" not in config and "weight 0" not in config
