"""The first minutes of `siglip-serve run`: refusals before Ray starts, quick 503s, progress lines.

Every test runs the real command in a subprocess on loopback; only the last one starts Ray.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from siglip_serve.launcher.preflight import free_port, port_in_use
from siglip_serve.launcher.startup import Placeholder
from tests.bounds import scaled
from tests.helpers import REPO

BIN = Path(sys.executable).parent
# The port refusals come before the heavy imports (torch, open_clip), so they are quick even on a
# busy 2-core machine; where imports come first, the tests time the check itself in-process.
FAST_S = scaled(30)


def siglip_serve(*args: str, env: dict[str, str] | None = None,
                 timeout: float = scaled(120)) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    out = subprocess.run([str(BIN / "siglip-serve"), *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})}, cwd=REPO)
    return out, time.monotonic() - began


def one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    return errors[0]


def test_taken_http_port_is_refused_in_one_line_before_ray() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out, seconds = siglip_serve("run", "--model", "tiny-siglip", "--port", str(port),
                                    "--metrics-port", str(free_port()), "--haproxy-metrics-port", "0")
    assert out.returncode == 2
    line = one_error_line(out.stderr)
    assert f"port {port} on 127.0.0.1 is already in use" in line and "--port" in line
    assert "starting Ray" not in out.stderr and seconds < FAST_S


def test_taken_metrics_port_is_refused_in_one_line_before_ray() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        metrics_port = holder.getsockname()[1]
        out, seconds = siglip_serve("run", "--model", "tiny-siglip", "--port", str(free_port()),
                                    "--metrics-port", str(metrics_port))
    assert out.returncode == 2
    line = one_error_line(out.stderr)
    assert f"metrics port {metrics_port}" in line and "METRICS_PORT" in line
    assert "starting Ray" not in out.stderr and seconds < FAST_S


def test_a_listener_sharing_its_port_still_blocks_the_check() -> None:
    """Another Serve proxy listens with SO_REUSEPORT; the check binds without it, so it sees the port taken."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        assert port_in_use("127.0.0.1", holder.getsockname()[1])


def _weights_check_seconds(monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[str, float]:
    """The weights preflight in this process (imports already paid): its message and how long it took."""
    from siglip_serve.models.loading import ModelLoadError, open_clip_module
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.model_checks import preflight_weights

    open_clip_module()  # pays open_clip's and timm's imports before the clock starts
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = ServiceConfig.from_args({"model": "ViT-B-16-SigLIP", "pretrained": "webli"})
    began = time.monotonic()
    with pytest.raises(ModelLoadError) as refused:
        preflight_weights(config)
    return str(refused.value), time.monotonic() - began


def test_offline_hub_fails_in_seconds_naming_the_make_command(monkeypatch: pytest.MonkeyPatch) -> None:
    message, seconds = _weights_check_seconds(monkeypatch, HF_HUB_OFFLINE="1")
    assert seconds < scaled(1) and "HF_HUB_OFFLINE" in message
    # The command as a user runs it: one line, exit 2 (its time is mostly imports on this busy VM).
    out, _ = siglip_serve("run", "--model", "ViT-B-16-SigLIP", "--port", str(free_port()), env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2
    line = one_error_line(out.stderr)
    assert "make serve MODEL=tiny-siglip" in line and "--checkpoint PATH" in line and "--random-weights" in line


def test_unreachable_hub_fails_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    # A hub endpoint on a loopback port nobody listens on: refused at once, like a host without network.
    message, seconds = _weights_check_seconds(monkeypatch, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}",
                                              HF_HUB_OFFLINE="0")
    # The hub's probe gives up after 3 s (README); a refused connection answers well before.
    assert seconds < 3 + scaled(2) and "unreachable" in message and "make serve MODEL=tiny-siglip" in message


def test_compile_dry_run_needs_no_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from siglip_serve.models.neuron.trace import CompileOptions, dry_run_plan
    from siglip_serve.models.settings import ModelSettings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dry_run_plan(ModelSettings(model="tiny-siglip"), CompileOptions(), tmp_path)  # imports paid here
    began = time.monotonic()
    plan = dry_run_plan(ModelSettings(model="ViT-B-16-SigLIP"), CompileOptions(), tmp_path).as_json()
    assert time.monotonic() - began < scaled(5)
    assert plan["weights"]["sha256"] == "unknown" and "provisional" in plan["weights"]["sha256_of"]
    out, _ = siglip_serve("compile", "--model", "ViT-B-16-SigLIP", "--dry-run", "--cache-root", str(tmp_path),
                          "--log-level", "ERROR", env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0 and json.loads(out.stdout)["weights"]["sha256"] == "unknown", out.stderr[-2000:]


def test_placeholder_answers_503_then_hands_the_port_over() -> None:
    port = free_port()
    placeholder = Placeholder("127.0.0.1", port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
            assert ready.json()["error"]["type"] == "not_ready" and ready.json()["error"]["code"] == 503
            assert client.post("/v1/embeddings/image", content=b"x").status_code == 503
            assert client.get("/healthz").status_code == 200
    finally:
        placeholder.release()
    # Serve's proxy binds without SO_REUSEADDR once port sharing is off: the port must be free now.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_taken_haproxy_metrics_port_is_refused_in_one_line_before_ray() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        out, seconds = siglip_serve("run", "--model", "tiny-siglip", "--port", str(free_port()),
                                    "--metrics-port", str(free_port()), "--haproxy-metrics-port", str(taken))
    assert out.returncode == 2
    line = one_error_line(out.stderr)
    assert f"HAProxy's metrics port {taken}" in line and "--haproxy-metrics-port" in line
    assert "starting Ray" not in out.stderr and seconds < FAST_S


# -- the application builder (`serve run deploy/serve-cpu.yaml`), in the test session's Ray ---------

def test_builder_refuses_an_app_the_cluster_cannot_hold_once_without_retry(serve_cluster) -> None:
    from ray.serve.exceptions import RayServeException

    from siglip_serve.serve.app import build_app

    # 20 encoders x 1 CPU + the ingress (0.5) + the text replica (0.5) on the test cluster's 16 CPUs:
    # could never all be scheduled.
    with pytest.raises(RayServeException, match=r"needs 21 CPUs .* the Ray cluster has 16") as refused:
        build_app({"model": "tiny-siglip", "replicas": 20})
    assert "encoder_num_cpus" in str(refused.value) and "\n" not in str(refused.value)


def test_unreachable_weights_are_refused_in_seconds_where_they_are_read_not_by_the_builder(
        serve_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    from siglip_serve.serve.app import build_app
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.towers.replica_start import ReplicaRefused, start_tower

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = {"model": "ViT-B-16-SigLIP", "pretrained": "webli", "replicas": 1, "text_replicas": 0}
    # The builder runs on the Ray head, which under KubeRay need not reach the hub or hold the cache.
    build_app(args)
    began = time.monotonic()
    refusal = "image encoder replica on node .* refused to start: .*make serve MODEL=tiny-siglip"
    with pytest.raises(ReplicaRefused, match=refusal):
        start_tower("image encoder replica", ServiceConfig.from_args(args).model_settings(), lambda: None)
    assert time.monotonic() - began < scaled(5)
