"""`siglip-serve run` as an operator runs it: the systemd unit's command line, its own Ray, the key from
the environment, and every way it is told to stop.

One service for the module, stopped as the unit's KillMode=mixed stops it (SIGTERM to the main process),
under load. The other ways (SIGTERM twice to the whole process group, SIGINT to the group as Ctrl-C
sends it, SIGINT to the main process) each start their own, text tower off to start sooner. Every stop
must answer each accepted request (200, or 503 once draining), exit 0 within drain_timeout_s + 10 s, and
leave no process of that service and neither of its ports behind. The second one starts on a port a
front end answered a 300-request burst on and stopped just before: not refused for the burst's closing
connections.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from siglip_serve.core.poll import poll
from siglip_serve.launcher import cli
from siglip_serve.launcher.preflight import free_port
from siglip_serve.serve.plan.config import ServiceConfig
from tests.bounds import SETTLE_S, START_S, STOP_S, cluster_start
from tests.helpers import REPO as ROOT
from tests.helpers import read_unit, streamed_png, unit_command, unit_environment, wait_until_ready
from tests.real_haproxy import burst_on_a_stopped_haproxy

pytestmark = pytest.mark.own_cluster

KEY = "env-only-key-7c1f"
# The unit's model (SO400M from the hub) swapped for the tiny one, sized for a 2-core test machine.
TINY = "--model tiny-siglip --random-weights --replicas 1 --torch-threads 1 --set encoder_num_cpus=0.5"
UNIT = read_unit()
_UNIT_ARGS = cli.build_parser().parse_args(unit_command(UNIT)[2:])
DRAIN_TIMEOUT_S = ServiceConfig.from_args(cli.run_settings(_UNIT_ARGS)).drain_timeout_s


@dataclass
class Service:
    process: subprocess.Popen
    url: str
    port: int
    metrics_port: int
    log: Path
    ready_s: float = 0.0


@dataclass
class Stop:
    """What one stop under load looked like, seen by its clients and its parent."""

    code: int | None = None
    seconds: float = 0.0
    in_flight_before: int = 0
    answered: list[int] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    ready_after: list[int] = field(default_factory=list)


def start_service(log: Path, model: str, port: int | None = None) -> Service:
    """The unit's ExecStart= with `model` for $SIGLIP_SERVE_MODEL, on `port` (None: a free one), in a session of
    its own (as systemd starts it), so a test can signal its whole process group. It starts under the cluster-start
    lock; `ready_s` counts from the lock's taking."""
    with cluster_start(f"the unit's command ({log.name})"):
        return _start_service(log, model, port)


def _start_service(log: Path, model: str, port: int | None) -> Service:
    began = time.monotonic()
    port, metrics_port = port or free_port(), free_port()
    command = unit_command(UNIT, {"SIGLIP_SERVE_MODEL": model})
    # The unit's script is this interpreter's `siglip-serve`, which `-m` runs from this checkout.
    command = [sys.executable, "-m", "siglip_serve", *command[1:],
               "--port", str(port), "--metrics-port", str(metrics_port), "--haproxy-metrics-port", "0"]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **unit_environment(UNIT), "PYTHONPATH": path, "SIGLIP_API_KEY": KEY}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                   start_new_session=True)
    service = Service(process, f"http://127.0.0.1:{port}", port, metrics_port, log)
    try:
        wait_until_ready(service.url + "/readyz", START_S, process, lambda: log.read_text()[-3000:])
    except BaseException:
        end(service)
        raise
    service.ready_s = time.monotonic() - began
    return service


def end(service: Service) -> None:
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGINT)
        try:
            service.process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(service.process.pid, signal.SIGKILL)
            service.process.wait()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    started = start_service(tmp_path_factory.mktemp("service") / "service.log", TINY)
    try:
        yield started
    finally:
        end(started)


def stop_under_load(service: Service, send: Callable[[], None]) -> Stop:
    """Keep 12 clients posting images, `send()` the signal(s), and wait for the process to exit."""
    image = streamed_png(1500, 1500, 16, 0, np.full(1500, 1000, ">u2").tobytes())
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "image/png"}
    stop, sent = threading.Event(), threading.Event()
    result = Stop()

    def load() -> None:
        # Like a client behind a load balancer: keeps sending until this instance says it is going
        # away (503), then goes elsewhere.
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                before = not sent.is_set()
                try:
                    response = client.post(service.url + "/v1/embeddings/image", content=image, headers=auth)
                except httpx.ConnectError:
                    return  # not accepted: the listener is gone
                except httpx.TransportError as exc:  # accepted, then closed without an answer
                    result.dropped.append(f"{'before' if before else 'after'} the signal: {exc!r}")
                    return
                result.answered.append(response.status_code)
                if response.status_code == 503:
                    return

    threads = [threading.Thread(target=load) for _ in range(12)]
    for thread in threads:
        thread.start()
    try:
        # Under way: answers coming back and the other clients' requests in flight.
        poll(lambda: len(result.answered), lambda answered: answered > 0, SETTLE_S, interval_s=0.2)
        result.in_flight_before = len(result.answered)
        began = time.monotonic()
        send()
        sent.set()
        with httpx.Client(timeout=5) as probe:
            for _ in range(10):
                try:
                    result.ready_after.append(probe.get(service.url + "/readyz").status_code)
                except httpx.TransportError:
                    break
                time.sleep(0.2)
        try:
            result.code = service.process.wait(DRAIN_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            pass
        result.seconds = time.monotonic() - began
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
    return result


def processes_of(service: Service) -> list[psutil.Process]:
    """The service's processes: its main process's descendants, Ray's and HAProxy among them."""
    return psutil.Process(service.process.pid).children(recursive=True)


def assert_stopped_cleanly(service: Service, stopped: Stop, processes: list[psutil.Process]) -> None:
    log = service.log.read_text()[-3000:]
    assert stopped.code == 0 and stopped.seconds < DRAIN_TIMEOUT_S + 10, (stopped.code, stopped.seconds, log)
    assert not stopped.dropped, stopped.dropped
    assert stopped.in_flight_before > 0 and set(stopped.answered) <= {200, 503}, stopped.answered
    assert 503 in stopped.ready_after, stopped.ready_after
    left = [proc for proc in processes if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE]
    assert len(processes) >= 4 and not left, (left, log)  # Ray's GCS, raylet, replicas at least
    # Nothing listens (a plain bind may still meet the TIME_WAIT of a connection the server closed).
    held = [c.laddr for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
            and c.laddr.port in (service.port, service.metrics_port)]
    assert not held, held
    print(f"exit {stopped.code} {stopped.seconds:.1f} s after the signal; {len(stopped.answered)} answered: "
          f"{stopped.answered.count(200)} x 200, {stopped.answered.count(503)} x 503")


def test_metrics_port_listens_on_loopback_only(service: Service) -> None:
    listeners = [c.laddr.ip for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == service.metrics_port]
    # Before: 0.0.0.0 (Ray rewrites a loopback node IP to the machine's address).
    assert listeners and set(listeners) == {"127.0.0.1"}, listeners
    assert httpx.get(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=10).status_code == 200


def test_every_front_end_port_listens_on_loopback_only(service: Service) -> None:
    haproxy = {proc.pid for proc in processes_of(service) if proc.name() == "haproxy"}
    listeners = [c.laddr for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.pid in haproxy]
    # The service port, HAProxy's stats and Prometheus frontends (Ray's template binds those two on
    # every interface, at fixed ports 8404 and 9101).
    assert len(listeners) >= 3 and {addr.ip for addr in listeners} == {"127.0.0.1"}, listeners
    assert service.port in {addr.port for addr in listeners}
    assert not {8404, 9101} & {addr.port for addr in listeners}


def is_loopback(ip: str) -> bool:
    import ipaddress

    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def test_only_the_api_port_is_reachable_beyond_loopback(service: Service) -> None:
    # Every listening socket of the service's whole process tree: Ray's, Serve's, HAProxy's, the replicas'.
    # Before: each replica's inter-deployment gRPC server listened on [::] (every interface).
    tree = [psutil.Process(service.process.pid), *processes_of(service)]
    listeners = []
    for proc in tree:
        try:
            connections = proc.net_connections("inet")
            listeners += [(proc.name(), c.laddr) for c in connections if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    assert len(listeners) >= 6, listeners  # HAProxy's three, Ray's GCS and raylet, the replicas' gRPC servers
    # The service runs with --host 127.0.0.1 (the unit's command line): nothing listens beyond loopback
    # (::ffff:127.0.0.1 is a dual-stack socket bound to IPv4 loopback).
    beyond = [(name, addr) for name, addr in listeners if not is_loopback(addr.ip)]
    assert not beyond, beyond
    assert service.port in {addr.port for _, addr in listeners}
    # No dashboard unless `run --dashboard` asks for one (tests/integration/test_cli.py starts one): Ray still
    # starts its head process, with the usage-stats module alone and no frontend (ray/_private/services.py
    # start_api_server), and none of the dashboard's module processes.
    commands = []
    for proc in tree:
        try:
            commands.append(" ".join(proc.cmdline()))
        except psutil.NoSuchProcess:
            continue
    heads = [c for c in commands if "dashboard/dashboard.py" in c]
    assert heads and all("--disable-frontend" in c for c in heads), heads
    assert not [c for c in commands if c.startswith("ray-dashboard-")], commands


def test_the_key_comes_from_the_environment_and_guards_docs(service: Service) -> None:
    for proc in [psutil.Process(service.process.pid), *processes_of(service)]:
        try:
            assert KEY not in " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
    assert httpx.get(service.url + "/docs", timeout=10).status_code == 401
    assert httpx.get(service.url + "/openapi.json", timeout=10).status_code == 401
    listed = httpx.get(service.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert listed.status_code == 200


def test_sigterm_to_the_main_process_as_systemd_sends_it_drains_and_exits_0(service: Service) -> None:
    # Before: 4-5 of 13-16 in-flight requests closed with no answer; exit took 9-28 s.
    processes = processes_of(service)
    stopped = stop_under_load(service, lambda: service.process.send_signal(signal.SIGTERM))
    assert_stopped_cleanly(service, stopped, processes)


@pytest.mark.parametrize("to_group,signum,times", [
    # Before: Ray's GCS and raylet died first; the service logged SIGTERM twice, waited 61 s for the
    # GCS and exited 1, HAProxy holding the port. The second SIGTERM is a supervisor repeating itself.
    pytest.param(True, signal.SIGTERM, 2, id="sigterm-twice-to-the-group"),
    # SIGINT to the group (Ctrl-C in a terminal) is relayed as SIGTERM is (tests/unit/test_session.py, both
    # signals, both targets) and the service handles it as SIGTERM; SIGINT to the main process with Ray:
    # tests/integration/test_cli.py. One Ray start each would cost ~45 s of CI apiece.
])
def test_every_signal_drains_and_exits_0(to_group: bool, signum: signal.Signals, times: int, tmp_path: Path) -> None:
    # The service's front end (the same HAProxy, bound the same way) answered a burst on this port and stopped
    # just now: its connections are closing (TIME_WAIT). Before: `run` refused the port for up to a minute.
    port = free_port()
    burst_on_a_stopped_haproxy(tmp_path, port)
    service = start_service(tmp_path / "service.log", TINY + " --set text_replicas=0", port=port)
    print(f"ready {service.ready_s:.1f} s after a start on a port a 300-request burst had just closed")

    def send() -> None:
        for index in range(times):
            time.sleep(0.3 if index else 0.0)  # while the first one drains
            if to_group:
                os.killpg(service.process.pid, signum)
            else:
                service.process.send_signal(signum)

    try:
        processes = processes_of(service)
        stopped = stop_under_load(service, send)
    finally:
        end(service)
    assert_stopped_cleanly(service, stopped, processes)
    log = service.log.read_text()
    # The service hears each signal once, through its parent, and a repeat does not cut the drain short.
    assert log.count(f"received {signum.name}; shutting down") == 1, log[-3000:]
    assert log.count(f"received {signum.name} again: already stopping") == times - 1, log[-3000:]
