"""The real Neuron path on a trn2: compile tiny-siglip with neuronx-cc, check it against the CPU,
serve it, and run the multi-core bench. Skipped (with the reason) where there is no Neuron SDK.

NeuronCores are reserved per process, so nothing Neuron runs in the pytest process: the compile
runs as `siglip-serve compile` in a subprocess, accuracy in subprocesses on core 1, the served
replica on core 0 (its own Ray worker), and the bench's workers afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from siglip_serve.models.neuron.manifest import Manifest, read_manifest
from siglip_serve.models.neuron.sdk import LNC_ENV, runtime_lnc
from tests.helpers import REPO, ServeCluster, TinyReference, deploy, tiny_settings

pytestmark = pytest.mark.neuron


@pytest.fixture(scope="module")
def lnc() -> int:
    return runtime_lnc()[0]


@dataclass
class Compiled:
    artifact_dir: Path
    manifest: Manifest


def compile_in_subprocess(root: Path, lnc: int, auto_cast: str) -> Compiled:
    """`siglip-serve compile` in its own process, so the pytest process never holds a NeuronCore."""
    proc = subprocess.run([sys.executable, "-m", "siglip_serve", "compile", "--model", "tiny-siglip",
                           "--buckets", "1,2", "--lnc", str(lnc), "--auto-cast", auto_cast, "--cache-root", str(root)],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    directory = Path(proc.stdout.strip().splitlines()[-1])
    return Compiled(directory, read_manifest(directory))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory, lnc: int) -> dict[str, Compiled]:
    root = tmp_path_factory.mktemp("trn2-artifacts")
    return {cast: compile_in_subprocess(root, lnc, cast) for cast in ("matmult", "none")}


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory, photo_jpegs: list[bytes]) -> Path:
    folder = tmp_path_factory.mktemp("trn2-images")
    for i, data in enumerate(photo_jpegs):
        (folder / f"{i}.jpg").write_bytes(data)
    return folder


def accuracy(a: str, b: str, folder: Path, out: Path) -> tuple[int, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NEURON_RT_VISIBLE_CORES": "1"}
    proc = subprocess.run([sys.executable, "-m", "siglip_serve", "accuracy", "--model", "tiny-siglip",
                           "--a", a, "--b", b, "--images", str(folder), "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())


def test_real_compile_records_the_sdk(compiled: dict[str, Compiled], lnc: int) -> None:
    for cast, result in compiled.items():
        manifest = result.manifest
        assert manifest.lnc == lnc and manifest.auto_cast == cast
        assert manifest.versions["torch_neuronx"] not in (None, "0.0.0+test-double")
        assert manifest.versions["neuronx_cc"] is not None
        assert all(seconds > 0 for seconds in manifest.compile_seconds.values())


def test_matmult_and_neuron_vs_cpu_meet_the_bar(compiled: dict[str, Compiled], image_folder: Path,
                                               tmp_path: Path) -> None:
    matmult, none = (str(compiled[c].artifact_dir) for c in ("matmult", "none"))
    code, vs_cpu = accuracy("backend=cpu", f"backend=neuron,artifact_dir={matmult},buckets=1,2",
                            image_folder, tmp_path / "cpu.json")
    assert code == 0 and vs_cpu["cosine_min"] >= 0.999, vs_cpu
    code, casts = accuracy(f"backend=neuron,artifact_dir={none},buckets=1,2",
                           f"backend=neuron,artifact_dir={matmult},buckets=1,2", image_folder, tmp_path / "cast.json")
    assert code == 0 and casts["cosine_min"] >= 0.999, casts


def test_real_artifact_serves_over_http(serve_cluster: ServeCluster, compiled: dict[str, Compiled], lnc: int,
                                        photo_jpegs: list[bytes], tiny_reference: TinyReference) -> None:
    from ray import serve

    deploy("trn2", "/trn2", backend="neuron", artifact_dir=str(compiled["matmult"].artifact_dir), buckets=[1, 2],
           replicas=1, neuron_cores_per_replica=0, encoder_num_cpus=0.5,
           env_vars={"NEURON_RT_VISIBLE_CORES": "0", LNC_ENV: str(lnc)})
    try:
        with httpx.Client(base_url=f"{serve_cluster.base_url}/trn2", timeout=120) as client:
            files = [("file", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(photo_jpegs[:3])]
            response = client.post("/v1/embeddings/image", files=files)
            assert response.status_code == 200, response.text
            for item, data in zip(response.json()["data"], photo_jpegs[:3], strict=True):
                got, want = np.array(item["embedding"]), tiny_reference.embed(data)
                assert float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))) >= 0.999
            (replica,) = client.get("/v1/models").json()["data"][0]["replicas"]
        assert replica["lnc"] == lnc and replica["neuron_rt_visible_cores"] == "0"
    finally:
        serve.delete("trn2")


def test_multicore_bench_on_two_cores(compiled: dict[str, Compiled]) -> None:
    from siglip_serve.measure.multicore import format_comparison, run_multicore

    result = run_multicore(tiny_settings(backend="neuron", artifact_dir=compiled["matmult"].artifact_dir),
                           cores=2, bucket=1, warmup=5, iterations=20)
    assert sorted(w.core for w in result.workers) == ["0", "1"]
    assert result.instance_images_per_second > 0 and result.lnc == compiled["matmult"].manifest.lnc
    assert "ours: neuron" in format_comparison(result)
