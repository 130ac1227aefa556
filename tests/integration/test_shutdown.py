"""`siglip-serve run` as an operator runs it: its own Ray, the key from the environment, SIGTERM under load.

One service process for the module (a second local Ray beside the session's): the metrics port on
loopback, the key never on the command line, /docs behind it, and a drain that answers every
accepted request before the process exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from siglip_serve.serve.runner import free_port
from tests.helpers import REPO as ROOT
from tests.helpers import streamed_png, wait_until_ready

KEY = "env-only-key-7c1f"
DRAIN_TIMEOUT_S = 20


@dataclass
class Service:
    process: subprocess.Popen
    url: str
    metrics_port: int
    log: Path


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    port, metrics_port = free_port(), free_port()
    log = tmp_path_factory.mktemp("service") / "service.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SIGLIP_API_KEY": KEY, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "siglip_serve.serve.cli", "run", "--model", "tiny-siglip", "--random-weights",
           "--replicas", "1", "--port", str(port), "--metrics-port", str(metrics_port), "--torch-threads", "1",
           "--set", f"drain_timeout_s={DRAIN_TIMEOUT_S}", "--set", "encoder_num_cpus=0.5"]
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/readyz", 240, process, lambda: log.read_text()[-3000:])
        yield Service(process, url, metrics_port, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def test_metrics_port_listens_on_loopback_only(service: Service) -> None:
    listeners = [c.laddr.ip for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == service.metrics_port]
    # Before: 0.0.0.0 (Ray rewrites a loopback node IP to the machine's address).
    assert listeners and set(listeners) == {"127.0.0.1"}, listeners
    assert httpx.get(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=10).status_code == 200


def test_every_front_end_port_listens_on_loopback_only(service: Service) -> None:
    tree = [psutil.Process(service.process.pid), *psutil.Process(service.process.pid).children(recursive=True)]
    haproxy = {proc.pid for proc in tree if proc.name() == "haproxy"}
    listeners = [c.laddr for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.pid in haproxy]
    # The service port, HAProxy's stats and Prometheus frontends (Ray's template binds those two on
    # every interface, at fixed ports 8404 and 9101).
    assert len(listeners) >= 3 and {addr.ip for addr in listeners} == {"127.0.0.1"}, listeners
    assert int(service.url.rsplit(":", 1)[1]) in {addr.port for addr in listeners}
    assert not {8404, 9101} & {addr.port for addr in listeners}


def test_the_key_comes_from_the_environment_and_guards_docs(service: Service) -> None:
    for proc in [psutil.Process(service.process.pid), *psutil.Process(service.process.pid).children(recursive=True)]:
        try:
            assert KEY not in " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
    assert httpx.get(service.url + "/docs", timeout=10).status_code == 401
    assert httpx.get(service.url + "/openapi.json", timeout=10).status_code == 401
    listed = httpx.get(service.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert listed.status_code == 200


def test_sigterm_under_load_answers_every_accepted_request(service: Service) -> None:
    image = streamed_png(1500, 1500, 16, 0, np.full(1500, 1000, ">u2").tobytes())
    stop = threading.Event()
    answered: list[int] = []
    dropped: list[str] = []
    ready_after_term: list[int] = []
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "image/png"}

    term_sent = threading.Event()

    def load() -> None:
        # Like a client behind a load balancer: keeps sending until this instance says it is
        # going away (503), then goes elsewhere.
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                before_term = not term_sent.is_set()
                try:
                    response = client.post(service.url + "/v1/embeddings/image", content=image, headers=auth)
                except httpx.ConnectError:
                    return  # not accepted: the listener is gone
                except httpx.TransportError as exc:  # accepted, then closed without an answer
                    dropped.append(f"{'before' if before_term else 'after'} SIGTERM: {exc!r}")
                    return
                answered.append(response.status_code)
                if response.status_code == 503:
                    return

    threads = [threading.Thread(target=load) for _ in range(12)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3)
        in_flight_before = len(answered)
        sent = time.monotonic()
        service.process.send_signal(signal.SIGTERM)
        term_sent.set()
        with httpx.Client(timeout=5) as probe:
            for _ in range(10):
                try:
                    ready_after_term.append(probe.get(service.url + "/readyz").status_code)
                except httpx.TransportError:
                    break
                time.sleep(0.2)
        service.process.wait(DRAIN_TIMEOUT_S + 15)
        exited_after = time.monotonic() - sent
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
    # Before: 4-5 of 13-16 in-flight requests closed with no answer; exit took 9-28 s.
    assert not dropped, dropped
    assert in_flight_before > 0 and set(answered) <= {200, 503}, answered
    assert 503 in ready_after_term, ready_after_term
    assert exited_after < DRAIN_TIMEOUT_S + 10, exited_after
    print(f"exit {exited_after:.1f} s after SIGTERM; {len(answered)} answered: "
          f"{answered.count(200)} x 200, {answered.count(503)} x 503")
