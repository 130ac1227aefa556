"""`siglip-serve run --config FILE` reloads on SIGHUP (launcher/reload.py) as systemd's ExecReload= sends it, to the
main process: a limit and the keys file changed in the file are in force after the signal, a change that needs a
restart is refused and logged naming its key, and every replica is the same process throughout. A real
subprocess on loopback, with a Ray of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from siglip_serve.core.poll import poll
from siglip_serve.launcher.preflight import free_port
from tests.bounds import SETTLE_S, START_S, STOP_S, cluster_start
from tests.helpers import wait_until_ready

pytestmark = pytest.mark.own_cluster

BIN = Path(sys.executable).parent
# A change of models rolls the ingress, and Serve keeps the replaced direct-ingress replica draining for at least
# 30 s (ray/serve/_private/constants.py), time for an outside load balancer to stop sending to it, before the
# application is running again. No outside balancer here: 2 s, as for the session's Ray (tests/conftest.py).
DRAIN_ENV = {**os.environ, "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}
OLD_KEY, NEW_KEY = "old-key", "new-key"


def keys_file(path: Path, *keys: str) -> Path:
    path.write_text("".join(f'[[keys]]\nname = "{key}"\nkey = "{key}"\n' for key in keys))
    return path


def replica_processes(proc: subprocess.Popen[str]) -> set[tuple[int, str]]:
    """(pid, APP:DEPLOYMENT) of every Serve replica of the service: Ray titles a replica's process
    ray::ServeReplica:APP:DEPLOYMENT, with `.METHOD` added while a call of it runs."""
    found = set()
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "ServeReplica:" in title:
            found.add((child.pid, title.split("ServeReplica:", 1)[1].split()[0].split(".", 1)[0]))
    return found


def post(url: str, key: str, jpeg: bytes, model: str | None = None) -> httpx.Response:
    return httpx.post(url + "/v1/embeddings/image", content=jpeg, timeout=60,
                      params={"model": model} if model else None,
                      headers={"Content-Type": "image/jpeg", "Authorization": f"Bearer {key}"})


class Service:
    """`siglip-serve run --config FILE` as a subprocess on loopback, its output gathered line by line."""

    def __init__(self, config: Path) -> None:
        self.config = config
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([str(BIN / "siglip-serve"), "run", "--config", str(config), "--port", str(port),
                                      "--metrics-port", str(free_port()), "--haproxy-metrics-port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=DRAIN_ENV)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout or ()), daemon=True)
        self.reader.start()

    def tail(self) -> str:
        return "".join(self.lines)[-3000:]

    def reload(self, text: str, says: str, timeout_s: float = SETTLE_S) -> None:
        """`text` written to the config file, SIGHUP sent as ExecReload=/bin/kill -HUP $MAINPID does, and the log
        line `says` awaited."""
        self.config.write_text(text)
        seen = len(self.lines)
        self.proc.send_signal(signal.SIGHUP)
        _, logged, _ = poll(lambda: "".join(self.lines[seen:]), lambda out: says in out, timeout_s, interval_s=0.2)
        assert logged, self.tail()


@contextlib.contextmanager
def running(config: Path) -> Iterator[Service]:
    """The service of `config`, ready; stopped by SIGTERM (exit 0 asserted) when the block ends without error,
    killed when it fails. It starts under the cluster-start lock."""
    with cluster_start("run --config"):
        service = Service(config)
        try:
            wait_until_ready(service.url + "/readyz", START_S, service.proc, service.tail)
        except BaseException:
            service.proc.kill()
            raise
    try:
        yield service
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(timeout=STOP_S) == 0, service.tail()
    finally:
        if service.proc.poll() is None:
            service.proc.kill()
        service.reader.join(timeout=10)


SERVICE = "text_replicas: 0\ningress_replicas: 1\ntorch_threads: 1\nencoder_num_cpus: 0.25\n"
MODEL_A = "  - {name: a, model: tiny-siglip, replicas: 1}\n"
MODEL_B = "  - {name: b, model: tiny-siglip2, replicas: 1}\n"


def config_text(settings: str, *models: str) -> str:
    return SERVICE + settings + "models:\n" + "".join(models)


@pytest.mark.timeout(600)  # one start, then a dozen changes each waited for
def test_sighup_puts_live_settings_in_force_refuses_a_restart_and_removes_and_adds_a_model(
        tmp_path: Path, photo_jpegs: list[bytes]) -> None:
    """One service start (each costs the suite tens of seconds), two parts. A limit and the keys file changed in the
    file are in force after SIGHUP, a change that needs a restart is refused naming its key, and no replica
    restarts. Then `models:` changed in the file: the removed model's towers stop and its requests are 404, the
    added one's start and answer, and the model left in place keeps its replica process throughout (each
    deployment pinned to its own slice of the plan: serve/app.py `pinned`)."""
    first, second = keys_file(tmp_path / "first.toml", OLD_KEY), keys_file(tmp_path / "second.toml", OLD_KEY, NEW_KEY)
    keys = f"api_keys_file: {second}\n"
    config = tmp_path / "config.yaml"
    config.write_text(config_text(f"api_keys_file: {first}\n", MODEL_A, MODEL_B))
    jpeg = photo_jpegs[0]
    with running(config) as service:
        url, proc = service.url, service.proc

        def post_to(model: str) -> int:
            return post(url, NEW_KEY, jpeg, model).status_code

        def encoders() -> dict[str, set[int]]:
            found: dict[str, set[int]] = {}
            for pid, deployment in replica_processes(proc):
                found.setdefault(deployment.rsplit(":", 1)[-1], set()).add(pid)
            return found

        assert post(url, OLD_KEY, jpeg).status_code == 200 and post(url, NEW_KEY, jpeg).status_code == 401
        # Model b answers too (its replica may still be loading when the service first says ready).
        answer, both, _ = poll(lambda: post(url, OLD_KEY, jpeg, "b"), lambda a: a.status_code == 200, SETTLE_S,
                               interval_s=0.5)
        assert both, answer.text
        _, all_up, _ = poll(lambda: replica_processes(proc), lambda found: len(found) == 3, SETTLE_S, interval_s=0.5)
        assert all_up, replica_processes(proc)  # the ingress and each model's encoder
        before = replica_processes(proc)

        # A deadline no request meets: 504 naming it, the documented refusal, from the new keys file's key.
        service.reload(config_text(keys + "request_timeout_s: 0.001\n", MODEL_A, MODEL_B),
                       "reload: live settings in force")
        answer, done, _ = poll(lambda: post(url, NEW_KEY, jpeg), lambda a: a.status_code == 504, SETTLE_S,
                               interval_s=0.3)
        assert done and "0.001 s" in answer.json()["error"]["message"], answer.text

        service.reload(config_text(keys + "request_timeout_s: 0.001\ndecode_threads: 2\n", MODEL_A, MODEL_B),
                       "decode_threads cannot change without a restart")
        assert post(url, NEW_KEY, jpeg).status_code == 504

        # The default deadline again.
        service.reload(config_text(keys, MODEL_A, MODEL_B), "reload: live settings in force")
        _, back, _ = poll(lambda: post(url, NEW_KEY, jpeg).status_code, lambda code: code == 200, SETTLE_S,
                          interval_s=0.3)
        assert back and post_to("b") == 200
        assert replica_processes(proc) == before  # no replica restarted
        kept = encoders()["Encoder-a"]

        service.reload(config_text(keys, MODEL_A), "reload: the models", 90)
        _, gone, _ = poll(lambda: post_to("b"), lambda code: code == 404, SETTLE_S, interval_s=0.5)
        assert gone, service.tail()
        _, stopped, _ = poll(encoders, lambda e: "Encoder-b" not in e, SETTLE_S, interval_s=0.5)
        assert stopped, encoders()
        assert post_to("a") == 200 and encoders()["Encoder-a"] == kept

        service.reload(config_text(keys, MODEL_A, MODEL_B), "reload: the models", 90)
        _, back, _ = poll(lambda: post_to("b"), lambda code: code == 200, SETTLE_S, interval_s=0.5)
        assert back, service.tail()
        assert post_to("a") == 200 and encoders()["Encoder-a"] == kept
