"""The TorchNeuron line for real on a trn2: `siglip-serve compile --backend neuron-native` with
neuronx-cc, the compiled model against the CPU, a restart that finds every graph in the NEFF cache,
and the served API. Skipped with its reason where TorchNeuron (torch-neuronx 2.14) is not installed.

Every step runs in its own process with the environment a replica gets (the artifact's recipe set
before torch is imported, one NeuronCore), so pytest itself never holds a NeuronCore.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from siglip_serve.core.poll import poll
from siglip_serve.launcher.preflight import free_port
from siglip_serve.models.neuron.env import VISIBLE_CORES_ENV, environment
from siglip_serve.models.neuron.runtime import neff_files, read_native_manifest
from tests.helpers import REPO, TinyReference

pytestmark = pytest.mark.neuron_native
LNC = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))
# bf16 matmuls (--auto-cast=matmult) against the float32 CPU model; seed 000 measured 0.99999 on SO400M.
MIN_COSINE = 0.99


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "siglip_serve", *args], cwd=REPO, capture_output=True,
                          text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torchneuron")
    proc = run_cli("compile", "--backend", "neuron-native", "--model", "tiny-siglip", "--buckets", "1,2",
                   "--lnc", str(LNC), "--cache-root", str(root))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[1/2] bucket 1" in proc.stderr and "[2/2] bucket 2" in proc.stderr  # progress per bucket
    return Path(proc.stdout.strip().splitlines()[-1])


def replica_environment(artifact: Path, core: int) -> dict[str, str]:
    manifest = read_native_manifest(artifact)
    return {**environment(manifest.recipe_env, artifact), VISIBLE_CORES_ENV: str(core)}


def test_compile_records_the_sdk_and_a_graph_per_bucket(artifact: Path) -> None:
    manifest = read_native_manifest(artifact)
    assert manifest.versions["torch_neuronx"].startswith("2.14.3.0.")
    assert manifest.versions["neuronx_cc"] == "2.28.7631.0" and manifest.lnc == LNC
    present = neff_files(artifact / "neff")
    assert all(manifest.graphs[str(b)] and set(manifest.graphs[str(b)]) <= set(present) for b in (1, 2))
    assert artifact.parent.name.startswith("torchneuron-2.14.3.0.")


def test_a_restart_compiles_nothing_and_matches_the_cpu(artifact: Path, photo_jpegs: list[bytes],
                                                        tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for i, data in enumerate(photo_jpegs):
        (folder / f"{i}.jpg").write_bytes(data)
    before = neff_files(artifact / "neff")
    out = tmp_path / "accuracy.json"
    proc = run_cli("accuracy", "--model", "tiny-siglip", "--a", "backend=cpu,buckets=1,2",
                   "--b", f"backend=neuron-native,artifact_dir={artifact},buckets=1,2", "--images", str(folder),
                   "--threshold", str(MIN_COSINE), "--json", str(out), env=replica_environment(artifact, 1))
    assert out.exists(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["passed"], result
    assert neff_files(artifact / "neff") == before, "the replica compiled instead of finding its graphs"


def test_served_over_http(artifact: Path, photo_jpegs: list[bytes], tiny_reference: TinyReference) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    server = subprocess.Popen(
        [sys.executable, "-m", "siglip_serve", "run", "--backend", "neuron-native", "--model", "tiny-siglip",
         "--buckets", "1,2", "--artifact-dir", str(artifact), "--neuron-cores", "1", "--replicas", "1",
         "--port", str(port), "--metrics-port", str(free_port()), "--haproxy-metrics-port", "0"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            def readiness() -> int | None:
                """/readyz's status; None while nothing answers or once the server has exited."""
                if server.poll() is not None:
                    return None
                try:
                    return client.get("/readyz").status_code
                except httpx.HTTPError:
                    return None

            # Minutes on a trn2 (each bucket's NEFF loads in the replica), or the server's exit.
            poll(readiness, lambda status: status == 200 or server.poll() is not None, 900, interval_s=2)
            assert server.poll() is None, server.stdout.read()[-4000:] if server.stdout else ""
            reply = client.post("/v1/embeddings/image", content=photo_jpegs[0],
                                headers={"Content-Type": "image/jpeg"})
            assert reply.status_code == 200, reply.text
            got = np.array(reply.json()["data"][0]["embedding"], dtype=np.float32)
            want = tiny_reference.embed(photo_jpegs[0])
            assert float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))) >= MIN_COSINE
            (replica,) = client.get("/v1/models").json()["data"][0]["replicas"]
            assert replica["backend"] == "neuron-native" and replica["lnc"] == LNC
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
