"""The `siglip-serve` command and Ray's own `serve run`, as real subprocesses on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from siglip_serve.core.poll import poll
from siglip_serve.launcher import timeline as phases
from siglip_serve.launcher.preflight import free_port
from tests.bounds import START_S, STOP_S, cluster_start, scaled
from tests.helpers import REPO, wait_until_ready

pytestmark = pytest.mark.own_cluster

BIN = Path(sys.executable).parent
# /readyz answers 503 within this of the command starting (launcher/startup.py's placeholder; docs/http-api.md
# promises its first second, from the interpreter's start: its imports come first).
FIRST_503_S = scaled(45)


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    wait_until_ready(url + "/readyz", START_S, proc,
                     lambda: proc.stdout.read()[-3000:] if proc.poll() is not None else "")


def descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def stop_and_check_nothing_left(proc: subprocess.Popen, children: list[psutil.Process], sig: int) -> str:
    proc.send_signal(sig)
    # Ray's own `serve run` stops every replica gracefully: tens of seconds beside the test session's
    # busy Ray on two cores. The bound is for a hang, not for speed.
    output, _ = proc.communicate(timeout=STOP_S)
    assert proc.returncode == 0, output[-3000:]
    _, alive = psutil.wait_procs(children, timeout=STOP_S)
    assert not alive, [(p.pid, p.name()) for p in alive]
    return output


def post_photo(url: str, jpeg: bytes) -> httpx.Response:
    return httpx.post(url + "/v1/embeddings/image", content=jpeg, headers={"Content-Type": "image/jpeg"}, timeout=60)


def test_no_weights_stops_with_one_clear_message() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # no network to the model hub, without waiting on DNS
    out = subprocess.run([str(BIN / "siglip-serve"), "run", "--model", "ViT-B-16-SigLIP", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=scaled(120), env=env)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, out.stderr[-2000:]
    assert "--checkpoint PATH" in errors[0] and "--random-weights" in errors[0] and "no network" in errors[0]
    assert "Traceback" not in out.stderr


def test_bad_option_value_stops_before_ray(tmp_path: Path) -> None:
    out = subprocess.run([str(BIN / "siglip-serve"), "run", "--model", "tiny-siglip", "--buckets", "0,4"],
                         capture_output=True, text=True, timeout=scaled(60))
    assert out.returncode == 2 and "buckets" in out.stderr and "Traceback" not in out.stderr


def test_run_refuses_at_once_what_the_ray_it_starts_can_never_hold() -> None:
    """The Ray `run` starts is this host's alone (serve/plan/cluster_fit.py): 2 encoders of one neuron_core each
    on the 1 core it declares could never both run, and no node will join to place the second: it stops before
    deploying anything, where a wait for a node would have deployed and waited (the subprocess's bound)."""
    with cluster_start("run refusing what its Ray cannot hold"):
        out = subprocess.run([str(BIN / "siglip-serve"), "run", "--model", "tiny-siglip", "--port", str(free_port()),
                              "--metrics-port", str(free_port()), "--haproxy-metrics-port", "0", "--neuron-cores",
                              "1", "--replicas", "2", "--set", "neuron_cores_per_replica=1", "--set",
                              "text_replicas=0"], capture_output=True, text=True, timeout=START_S)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, out.stderr[-3000:]
    assert "needs 2 neuron_cores" in errors[0] and "declares 1" in errors[0] and "--neuron-cores N" in errors[0]
    assert "Traceback" not in out.stderr and "deploying" not in out.stderr


def test_run_answers_503_while_starting_serves_then_sigint_leaves_no_ray_process(photo_jpegs: list[bytes]) -> None:
    """Run with the defaults, whose CPU plan (serve/plan/cpu_plan.py) gives a small model one replica
    per usable core, one torch thread each. From its first seconds /readyz answers 503 not_ready (the
    start-up placeholder) while progress is logged; then it serves, Serve's port is not shared, Ray's own
    CLI reaches this cluster as the log says (`--dashboard`: the dashboard is what it talks to); `--timings`
    prints the start's timeline, the service's phases and each replica's; Ctrl-C to the main process
    (SIGINT) stops it all, exit 0 (SIGTERM and group signals: tests/integration/test_shutdown.py). One
    service start for all of it."""
    port = free_port()
    starting = contextlib.ExitStack()  # the cluster-start lock, from the command's start until every replica is up
    starting.enter_context(cluster_start("run's start"))
    began = time.monotonic()
    proc = subprocess.Popen(
        [str(BIN / "siglip-serve"), "run", "--model", "tiny-siglip", "--port", str(port),
         "--metrics-port", str(free_port()), "--haproxy-metrics-port", "0", "--timings", "--dashboard"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"

    def first_503() -> float | None:
        """The seconds from the command's start to /readyz's 503 not_ready; None until it answers one."""
        assert proc.poll() is None, "".join(lines)[-3000:]
        try:
            response = httpx.get(f"{url}/readyz", timeout=15)
        except httpx.TransportError:
            return None
        if response.status_code != 503:
            return None
        assert response.json()["error"]["type"] == "not_ready"
        return time.monotonic() - began

    try:
        answered, _, _ = poll(first_503, lambda seconds: seconds is not None or any("ready in" in x for x in lines),
                              START_S, interval_s=0.2)
        assert answered is not None and answered < FIRST_503_S, (answered, "".join(lines)[-3000:])
        wait_ready(url, proc)
        children = descendants(proc)
        assert any("raylet" in " ".join(p.cmdline()) for p in children)
        assert len(post_photo(url, photo_jpegs[0]).json()["data"][0]["embedding"]) == 64
        cores = len(os.sched_getaffinity(0))
        model, every_replica_up, _ = poll(lambda: httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0],
                                          lambda m: len(m["replicas"]) == cores, START_S)
        starting.close()
        assert every_replica_up and model["replicas_expected"] == cores, model
        assert [replica["torch_threads"] for replica in model["replicas"]] == [1] * cores
        # Serve's proxy holds the port without SO_REUSEPORT: a second listener that asks to share it is refused.
        with socket.socket() as second:
            second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            with pytest.raises(OSError):
                second.bind(("127.0.0.1", port))
        # Ray's own CLI, as the log line says (token auth on; this cluster's dashboard, not localhost:8265).
        hint = next(line for line in lines if "Ray's CLI for this cluster" in line)
        command = hint.split("Ray's CLI for this cluster: ", 1)[1].split()
        assert command[0] == "RAY_AUTH_MODE=token"
        status = subprocess.run([str(BIN / command[1]), *command[2:]], capture_output=True, text=True,
                                timeout=scaled(60), env={**os.environ, "RAY_AUTH_MODE": "token"})
        assert status.returncode == 0 and "siglip" in status.stdout and "RUNNING" in status.stdout, status
        proc.send_signal(signal.SIGINT)
        # Bound for a hang, not for speed (see stop_and_check_nothing_left).
        assert proc.wait(timeout=STOP_S) == 0, "".join(lines)[-3000:]
        reader.join(timeout=10)
        _, alive = psutil.wait_procs(children, timeout=STOP_S)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        starting.close()
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines)
    assert "encoder replicas warm" in output and "ready in" in output, output[-3000:]
    assert "stopping Serve and Ray" in output
    assert "503 not_ready" not in output  # no line per probe answered 503 during start-up
    timeline = output.split("start timeline", 1)[1].split("draining", 1)[0].splitlines()
    took = {line.strip().rsplit(None, 2)[0]: float(line.split()[-2]) for line in timeline if line.startswith("  ")
            and not line.strip().startswith(("phase", "image replica", "text replica"))}
    # auto on cpu: an image replica per core, beside the ingress and a text replica, is more than the cores, so the
    # start goes in two waves (serve/plan/start_order.py) and the timeline is printed once the second is warm.
    deploy = [phases.FIRST_WAVE, phases.SECOND_WAVE] if cores > 1 else [phases.DEPLOY]
    assert list(took) == [phases.RELAY, phases.INTERPRETER, phases.ARGUMENTS, phases.CHECKS, phases.RAY_IMPORTS,
                          phases.RAY_INIT, phases.PLAN, phases.SERVE_START, *deploy], timeline
    assert took[phases.RAY_INIT] > 0 and took[deploy[0]] > 0
    images = [line for line in timeline if line.strip().startswith("image replica")]
    assert len(images) == cores, timeline
    assert all("model build" in line and "warm-up 8 " in line and "registration" in line for line in images), images
    assert any(line.strip().startswith("text replica") for line in timeline), timeline


def test_serve_cpu_yaml_runs_under_rays_own_serve_run(tmp_path: Path, photo_jpegs: list[bytes]) -> None:
    spec = yaml.safe_load((REPO / "deploy" / "serve-cpu.yaml").read_text())
    port = free_port()
    spec["http_options"]["port"] = port
    args = spec["applications"][0]["args"]
    args.update(model="tiny-siglip", torch_threads=1, text_replicas=0)  # images only: one process less to start
    args.pop("pretrained", None)
    config = tmp_path / "serve-tiny.yaml"
    config.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    # SIGINT at its default: a test run started in the background (`cmd &` in a script) ignores
    # SIGINT, children inherit that, and Ray's `serve run` would never see the Ctrl-C sent below.
    starting = contextlib.ExitStack()
    starting.enter_context(cluster_start("Ray's serve run"))
    proc = subprocess.Popen([str(BIN / "serve"), "run", str(config)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        starting.close()
        children = descendants(proc)
        assert post_photo(url, photo_jpegs[1]).status_code == 200
        stop_and_check_nothing_left(proc, children, signal.SIGINT)
    finally:
        starting.close()
        if proc.poll() is None:
            proc.kill()
