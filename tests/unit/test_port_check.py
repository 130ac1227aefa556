"""`siglip-serve run`'s port check (launcher/preflight.py) against real sockets on loopback: a restart right after
a burst is not refused for the burst's closing connections, while a port something listens on still is.

A burst of short connections that the server closes first leaves each one in TIME_WAIT on the server's port
(the side that closes first holds it) for up to a minute after the server has stopped."""

from __future__ import annotations

import errno
import socket
import threading
import time
from pathlib import Path

import pytest

from siglip_serve.launcher.preflight import (
    EPHEMERAL_RANGE_FILE,
    LISTENER_PORTS_FROM,
    PortUnavailable,
    check_ports,
    free_port,
    listener_ports,
    port_in_use,
)
from siglip_serve.launcher.startup import Placeholder
from tests.bounds import scaled
from tests.real_haproxy import (
    ANSWERING,
    BURST,
    REQUEST,
    burst,
    burst_on_a_stopped_haproxy,
    closing_connections,
    running_haproxy,
)


def burst_on_a_stopped_server(reuse_address: bool) -> int:
    """A free port that a server (binding with SO_REUSEADDR or not) answered a burst on and then stopped."""
    server = socket.socket()
    if reuse_address:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    port = int(server.getsockname()[1])

    def answer() -> None:
        for _ in range(BURST):
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    thread = threading.Thread(target=answer)
    thread.start()
    burst(port)
    thread.join(10)
    server.close()
    assert closing_connections(port) >= BURST // 2  # the burst is still closing: the case under test
    return port


def test_a_burst_on_a_listener_binding_as_haproxy_does_not_block_a_restart() -> None:
    port = burst_on_a_stopped_server(reuse_address=True)
    # Before: "port ... is already in use" for up to a minute while nothing listened.
    assert not port_in_use("127.0.0.1", port)
    check_ports("127.0.0.1", port, "127.0.0.1", None)
    placeholder = Placeholder("127.0.0.1", port, reuse_address=True)  # what `run` binds next
    placeholder.release()
    # Serve's own proxy (--front-end python) binds without SO_REUSEADDR: those connections refuse it, and the
    # refusal says why rather than naming another instance only.
    with pytest.raises(PortUnavailable, match="closing the connections of a run just stopped"):
        check_ports("127.0.0.1", port, "127.0.0.1", None, front_end="python")


@pytest.mark.parametrize("options", [(), (socket.SO_REUSEPORT,), (socket.SO_REUSEADDR,),
                                     (socket.SO_REUSEADDR, socket.SO_REUSEPORT)],
                         ids=["plain", "reuseport", "reuseaddr", "reuseaddr-reuseport"])
@pytest.mark.parametrize("front_end", ["haproxy", "python"])
def test_a_port_something_listens_on_is_still_refused(options: tuple[int, ...], front_end: str) -> None:
    with socket.socket() as holder:
        for option in options:
            holder.setsockopt(socket.SOL_SOCKET, option, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortUnavailable, match=f"port {port} on 127.0.0.1 is already in use"):
            check_ports("127.0.0.1", port, "127.0.0.1", None, front_end=front_end)
        # The metrics ports' listeners bind with SO_REUSEADDR too: one that listens is refused all the same.
        with pytest.raises(PortUnavailable, match=f"metrics port {port}"):
            check_ports("127.0.0.1", free_port(), "127.0.0.1", port, front_end=front_end)


def test_haproxy_stopped_right_after_a_burst_is_restarted_at_once(tmp_path: Path) -> None:
    port = free_port()
    burst_on_a_stopped_haproxy(tmp_path, port)
    began = time.monotonic()
    check_ports("127.0.0.1", port, "127.0.0.1", None)  # before: refused, the port "already in use"
    with running_haproxy(ANSWERING.format(port=port), tmp_path, port):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(REQUEST)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    assert time.monotonic() - began < scaled(5)


def test_a_listener_cannot_bind_the_local_port_of_an_outgoing_connection() -> None:
    """Why free_port keeps out of the kernel's ephemeral range: a port picked there can be taken, before the
    listener binds it, as the local port of any connection this host opens (here: one to a loopback server)."""
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()[:2], timeout=5) as outgoing:
        taken = outgoing.getsockname()[1]
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as HAProxy's listeners bind
            with pytest.raises(OSError) as refused:
                listener.bind(("127.0.0.1", taken))
    assert refused.value.errno == errno.EADDRINUSE
    low, high = map(int, EPHEMERAL_RANGE_FILE.read_text().split())
    assert low <= taken <= high


def test_free_ports_lie_between_rays_worker_ports_and_the_ephemeral_range() -> None:
    low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(LISTENER_PORTS_FROM <= port < low for port in ports), sorted(ports)
    assert len(ports) > 1  # picked at random, not one port every time


def test_the_listener_range_comes_from_the_kernels_range(tmp_path: Path) -> None:
    given = tmp_path / "ip_local_port_range"
    given.write_text("32768\t60999\n")
    assert listener_ports(given) == range(LISTENER_PORTS_FROM, 32768)
    given.write_text("20500\t60999\n")  # no gap worth the name: the kernel's pick instead
    assert listener_ports(given) is None
    assert listener_ports(tmp_path / "missing") is None


def test_a_taken_port_is_never_returned() -> None:
    with socket.create_server(("127.0.0.1", free_port())) as holder:
        held = holder.getsockname()[1]
        assert free_port(ports=range(held, held + 1)) != held  # the only candidate is taken: the kernel picks
